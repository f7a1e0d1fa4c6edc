//! Verifier errors, Cranelift style: every `tests/text_cases/verify/*.ir` file is a
//! graph that parses but is invalid, with `; error: <message>` at the end of the
//! offending line. The harness checks that parsing fails with a verifier (not a
//! parse) error whose text contains the message and names the culprit: for a node
//! line, `node #<index> %<first result> (`<op>`)` derived from the file itself; for
//! an update line, the graph. Cases the text form cannot express (use before
//! definition) are built with `Graph::push_node_unchecked` below.

#![expect(
    clippy::unwrap_used,
    reason = "a test fails loudly on any unexpected error"
)]

use dlrm_ir::{Dim, Graph, IrError, Op, TensorType, text, verify};
use std::path::Path;

/// What a case file expects.
struct Expect {
    /// The `; error:` message.
    message: String,
    /// `node #n %name (`op`)` or `graph `name``.
    culprit: String,
}

/// Reads the expectation from the case: the single line carrying `; error:`.
fn expectation(src: &str) -> Expect {
    let mut graph = None;
    let mut nodes = 0usize;
    let mut found = None;
    for line in src.lines() {
        let (code, comment) = match line.split_once(';') {
            Some((code, comment)) => (code.trim(), Some(comment.trim())),
            None => (line.trim(), None),
        };
        if let Some(name) = code.strip_prefix("graph @") {
            graph = Some(name.trim_end_matches(" {").to_string());
        }
        let is_node = code.starts_with('%');
        if let Some(message) = comment.and_then(|c| c.strip_prefix("error:")) {
            assert!(found.is_none(), "one `; error:` per case");
            let culprit = if is_node {
                let name = &code[1..code.find(':').expect("a typed result")];
                let rhs = code.split_once(" = ").expect("a node line has `=`").1;
                let op = rhs.split_whitespace().next().expect("an op");
                format!("node #{nodes} %{name} (`{op}`)")
            } else {
                format!("graph `{}`", graph.clone().expect("a graph line first"))
            };
            found = Some(Expect {
                message: message.trim().to_string(),
                culprit,
            });
        }
        if is_node {
            nodes += 1;
        }
    }
    found.expect("a `; error:` line")
}

#[test]
fn verify_cases() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/text_cases/verify");
    let mut names = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "ir") {
            continue;
        }
        let src = std::fs::read_to_string(&path).unwrap();
        let want = expectation(&src);
        let name = path.file_stem().unwrap().to_string_lossy().to_string();
        let err = match text::parse(&src) {
            Ok(_) => panic!("{name}: parsed and verified, expected an error"),
            Err(e) => e,
        };
        assert!(
            matches!(err, IrError::Node { .. } | IrError::Graph { .. }),
            "{name}: expected a verifier error, got {err:?}"
        );
        let msg = err.to_string();
        assert!(
            msg.contains(&want.message),
            "{name}: `{msg}` does not contain `{}`",
            want.message
        );
        assert!(
            msg.contains(&want.culprit),
            "{name}: `{msg}` does not name `{}`",
            want.culprit
        );
        names.push(name);
    }
    names.sort();
    // Every kind of error in the brief is present (a deleted file fails here).
    for must in [
        "linear_shape",
        "index_dtype",
        "declared_type",
        "duplicate_update",
        "update_type",
        "a2a_counts",
        "a2a_declared",
    ] {
        assert!(names.iter().any(|n| n == must), "missing case {must}");
    }
    assert!(names.len() >= 15, "{names:?}");
}

/// Removing the offending line of each node case makes the graph valid again, so
/// each case fails for the reason it states and no other.
#[test]
fn verify_cases_fail_only_on_their_line() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/text_cases/verify");
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "ir") {
            continue;
        }
        let src = std::fs::read_to_string(&path).unwrap();
        let (bad, rest): (Vec<&str>, Vec<&str>) = src.lines().partition(|l| l.contains("; error:"));
        let bad_name = bad[0].trim().split(':').next().unwrap().to_string();
        // Drop the bad line and every line mentioning its first result.
        let fixed: String = rest
            .iter()
            .filter(|l| !bad_name.starts_with('%') || !l.contains(&bad_name))
            .map(|l| format!("{l}\n"))
            .collect();
        if let Err(e) = text::parse(&fixed) {
            panic!(
                "{}: still invalid without its error line: {e}",
                path.display()
            );
        }
    }
}

#[test]
fn use_before_definition() {
    let mut g = Graph::new("ubd");
    let x = g
        .add_input("x", TensorType::f32([Dim::batch(), 4.into()]))
        .unwrap();
    let ty = g.ty(x).clone();
    // Node 0 reads %b, which node 1 defines: value ids are x=0, a=1, b=2.
    let later = dlrm_ir::ValueId(2);
    g.push_node_unchecked(Op::Relu, vec![later], vec![("a".into(), ty.clone())])
        .unwrap();
    g.push_node_unchecked(Op::Relu, vec![x], vec![("b".into(), ty)])
        .unwrap();
    let err = verify(&g).unwrap_err();
    assert_eq!(
        err.to_string(),
        "node #0 %a (`relu`): operand 0 %b is used before it is defined"
    );
    // The printer still prints it; the parser rejects the name at its use.
    let s = text::print(&g);
    assert!(s.contains("  %a: f32[B,4] = relu %b\n"), "{s}");
    match text::parse(&s) {
        Err(IrError::Parse { line, col, reason }) => {
            assert_eq!((line, col, reason.as_str()), (3, 23, "unknown value %b"));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn operand_out_of_range() {
    let mut g = Graph::new("oor");
    let x = g
        .add_input("x", TensorType::f32([Dim::batch(), 4.into()]))
        .unwrap();
    let ty = g.ty(x).clone();
    g.push_node_unchecked(Op::Relu, vec![dlrm_ir::ValueId(7)], vec![("a".into(), ty)])
        .unwrap();
    assert_eq!(
        verify(&g).unwrap_err().to_string(),
        "node #0 %a (`relu`): operand 0 does not exist"
    );
    // The Graphviz export still draws a broken graph.
    assert!(dlrm_ir::dot::to_dot(&g).contains("missing"));
}
