//! Every rejected description: the error kind, and that the message names the origin
//! and the field.

mod common;

use common::{example, tiny_set, tiny_with};
use dlrm_json::{Error, ModelSpec};
use serde_json::{Value, json};

const ORIGIN: &str = "models/bad.json";

fn parse_err(src: &str) -> Error {
    match ModelSpec::parse(src, ORIGIN) {
        Ok(spec) => panic!("accepted: {spec:?}"),
        Err(e) => e,
    }
}

/// Sets one field of the tiny example and expects an `Invalid` error on `field`.
fn expect_invalid(set: &str, value: Value, field: &str, reason_has: &str) {
    let err = parse_err(&tiny_set(set, value));
    let msg = err.to_string();
    match &err {
        Error::Invalid {
            origin,
            field: f,
            reason,
        } => {
            assert_eq!(origin, ORIGIN);
            assert_eq!(f, field, "{msg}");
            assert!(reason.contains(reason_has), "{msg}");
        }
        other => panic!("expected Invalid on `{field}`, got {other:?}"),
    }
    assert!(msg.starts_with(ORIGIN), "{msg}");
    assert!(msg.contains(&format!("`{field}`")), "{msg}");
}

/// Expects a serde error (line and column known) whose message contains `has`, on
/// `field` if given.
fn expect_json(src: &str, field: Option<&str>, has: &str) {
    let err = parse_err(src);
    let msg = err.to_string();
    match &err {
        Error::Json {
            origin,
            field: f,
            line,
            column,
            message,
        } => {
            assert_eq!(origin, ORIGIN);
            assert_eq!(f.as_deref(), field, "{msg}");
            assert!(*line > 0 && *column > 0, "{msg}");
            assert!(message.contains(has), "{msg}");
            assert!(!message.contains(" at line "), "position twice: {msg}");
            assert!(
                msg.starts_with(&format!("{ORIGIN}:{line}:{column}: ")),
                "{msg}"
            );
        }
        other => panic!("expected a JSON error, got {other:?}"),
    }
    if let Some(f) = field {
        assert!(msg.contains(&format!("`{f}`")), "{msg}");
    }
}

#[test]
fn malformed_json_reports_line_and_column() {
    let src = "{\n  \"name\": \"x\",\n  \"dense_features\": 13,,\n}";
    let err = parse_err(src);
    match err {
        Error::Json { line, column, .. } => {
            assert_eq!(line, 3);
            assert_eq!(column, 24);
        }
        other => panic!("{other:?}"),
    }
    expect_json(src, None, "key must be a string");
    // Truncated input.
    expect_json("{\n  \"name\": \"x\"", None, "EOF while parsing an object");
}

#[test]
fn trailing_characters_are_rejected() {
    let src = format!("{} x", tiny_set("seed", json!(1)));
    expect_json(&src, None, "trailing characters");
}

#[test]
fn unknown_field_is_named() {
    expect_json(
        &tiny_set("embedding_size", json!(8)),
        Some("embedding_size"),
        "unknown field `embedding_size`, expected one of",
    );
}

#[test]
fn duplicate_and_missing_fields_are_named() {
    let src = tiny_set("seed", json!(1)).replacen("\"seed\"", "\"seed\": 2, \"seed\"", 1);
    expect_json(&src, None, "duplicate field `seed`");
    let src = tiny_with(|m| {
        m.remove("batch_size");
    });
    expect_json(&src, None, "missing field `batch_size`");
}

#[test]
fn wrong_type_names_the_field() {
    expect_json(
        &tiny_set("embedding_dim", json!("8")),
        Some("embedding_dim"),
        "invalid type",
    );
    expect_json(
        &tiny_set("table_rows", json!([50, -30, 20])),
        Some("table_rows[1]"),
        "-30",
    );
    expect_json(&tiny_set("pooling", json!(1.5)), Some("pooling"), "1.5");
    expect_json(&tiny_set("pooling", json!(-1)), Some("pooling"), "-1");
}

#[test]
fn unknown_enum_values_name_the_field() {
    expect_json(
        &tiny_set("pooling_mode", json!("max")),
        Some("pooling_mode"),
        "`max`",
    );
    expect_json(
        &tiny_set("interaction", json!("concat")),
        Some("interaction"),
        "`concat`",
    );
    expect_json(&tiny_set("loss", json!("hinge")), Some("loss"), "`hinge`");
    expect_json(
        &tiny_set("optimizer", json!("adam")),
        Some("optimizer"),
        "`adam`",
    );
}

#[test]
fn adagrad_hyper_parameters_are_checked() {
    let with = |opt: &str, key: &str, v: Value| {
        let mut j: Value = serde_json::from_str(&tiny_set("optimizer", json!(opt))).expect("json");
        j[key] = v;
        j.to_string()
    };
    let invalid = |src: String, field: &str, has: &str| match parse_err(&src) {
        Error::Invalid {
            field: f, reason, ..
        } => {
            assert_eq!(f, field);
            assert!(reason.contains(has), "{reason}");
        }
        other => panic!("expected Invalid, got {other}"),
    };
    invalid(with("adagrad", "eps", json!(0.0)), "eps", "> 0");
    invalid(with("rowwise_adagrad", "eps", json!(-1.0)), "eps", "> 0");
    invalid(
        with("adagrad", "initial_accumulator_value", json!(-0.5)),
        "initial_accumulator_value",
        ">= 0",
    );
    invalid(
        with("adagrad", "weight_decay", json!(1e300)),
        "weight_decay",
        "finite",
    );
    invalid(
        with("sgd", "eps", json!(1e-8)),
        "eps",
        "adagrad optimizers only",
    );
    // Accepted, with the values given and PyTorch's defaults for the others.
    let s = ModelSpec::parse(&with("rowwise_adagrad", "eps", json!(1e-8)), ORIGIN).expect("valid");
    assert_eq!(
        s.optimizer,
        dlrm_json::Optimizer::RowwiseAdagrad(dlrm_json::Adagrad {
            eps: 1e-8,
            ..Default::default()
        })
    );
}

#[test]
fn malformed_width_string_names_the_field() {
    expect_json(
        &tiny_set("bottom_mlp", json!("4-x-8")),
        Some("bottom_mlp"),
        "`x`",
    );
    expect_json(
        &tiny_set("top_mlp", json!("")),
        Some("top_mlp"),
        "layer width",
    );
    expect_json(
        &tiny_set("top_mlp", json!({"a": 1})),
        Some("top_mlp"),
        "list of layer widths",
    );
}

#[test]
fn zero_dense_features() {
    expect_invalid("dense_features", json!(0), "dense_features", "> 0");
}

#[test]
fn zero_embedding_dim() {
    expect_invalid("embedding_dim", json!(0), "embedding_dim", "> 0");
}

#[test]
fn zero_table_rows() {
    expect_invalid("table_rows", json!([50, 0, 20]), "table_rows[1]", "> 0");
}

#[test]
fn empty_table_list() {
    expect_invalid("table_rows", json!([]), "table_rows", "at least one table");
}

#[test]
fn zero_pooling() {
    expect_invalid("pooling", json!(0), "pooling", "> 0");
    expect_invalid("pooling", json!([2, 0, 2]), "pooling[1]", "> 0");
}

#[test]
fn pooling_list_length_must_match_tables() {
    expect_invalid("pooling", json!([1, 2]), "pooling", "3 tables");
}

#[test]
fn zero_layer_widths() {
    expect_invalid("bottom_mlp", json!([4, 0, 8]), "bottom_mlp[1]", "> 0");
    expect_invalid("bottom_mlp", json!("4-16-0"), "bottom_mlp[2]", "> 0");
    expect_invalid("top_mlp", json!([0, 1]), "top_mlp[0]", "> 0");
}

#[test]
fn zero_batch_size() {
    expect_invalid("batch_size", json!(0), "batch_size", "> 0");
}

#[test]
fn bottom_input_must_equal_dense_features() {
    expect_invalid(
        "bottom_mlp",
        json!([5, 16, 8]),
        "bottom_mlp[0]",
        "dense_features 4",
    );
}

#[test]
fn bottom_needs_a_layer() {
    expect_invalid("bottom_mlp", json!([4]), "bottom_mlp", "at least one layer");
}

#[test]
fn dot_bottom_output_must_equal_embedding_dim() {
    expect_invalid(
        "bottom_mlp",
        json!([4, 16, 9]),
        "bottom_mlp[2]",
        "embedding_dim 8",
    );
}

#[test]
fn top_last_width_must_be_one() {
    expect_invalid("top_mlp", json!([16, 2]), "top_mlp[1]", "width 1");
    expect_invalid("top_mlp", json!([]), "top_mlp", "output layer");
}

#[test]
fn learning_rate_must_be_finite_and_positive() {
    expect_invalid("learning_rate", json!(0.0), "learning_rate", "> 0");
    expect_invalid("learning_rate", json!(-0.1), "learning_rate", "-0.1");
    // Finite as f64, infinite as f32.
    expect_invalid("learning_rate", json!(1e39), "learning_rate", "inf");
    // Positive as f64, zero as f32.
    expect_invalid("learning_rate", json!(1e-50), "learning_rate", "> 0");
}

#[test]
fn interaction_itself_needs_dot() {
    let src = tiny_with(|m| {
        m.insert("interaction".into(), json!("cat"));
        m.insert("interaction_itself".into(), json!(true));
    });
    let err = parse_err(&src);
    assert!(
        matches!(&err, Error::Invalid { field, .. } if field == "interaction_itself"),
        "{err}"
    );
}

#[test]
fn graph_name_must_be_printable() {
    expect_invalid("name", json!("my model"), "name", "\"my model\"");
    expect_invalid("name", json!(""), "name", "one or more");
}

#[test]
fn missing_file_names_the_path() {
    let path = example("no-such-model");
    let err = dlrm_json::load(&path).expect_err("missing file");
    assert!(matches!(err, Error::Io { .. }), "{err:?}");
    assert!(err.to_string().contains("no-such-model.json"), "{err}");
}

#[test]
fn file_errors_name_the_file() {
    let dir = std::env::temp_dir().join(format!("dlrm-json-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("mkdir");
    let path = dir.join("zero-dim.json");
    std::fs::write(&path, tiny_set("embedding_dim", json!(0))).expect("write");
    let err = dlrm_json::load(&path).expect_err("invalid");
    let msg = err.to_string();
    assert!(msg.starts_with(&path.display().to_string()), "{msg}");
    assert!(msg.contains("`embedding_dim`"), "{msg}");
    std::fs::remove_dir_all(&dir).expect("cleanup");
}

#[test]
fn building_an_unvalidated_spec_validates_it() {
    let mut spec = ModelSpec::load(example("dlrm-tiny")).expect("load");
    spec.top_mlp = vec![16, 3];
    let err = spec.graph().expect_err("invalid");
    assert!(err.to_string().contains("model `dlrm-tiny`"), "{err}");
    assert!(spec.init_params().is_err());
    assert!(spec.build().is_err());
}

/// A cross network of more layers than `MAX_DCN_LAYERS` is refused before any
/// graph is built (100 million layers once ran the compiler out of memory).
#[test]
fn too_many_cross_layers_are_refused_naming_the_field() {
    let src = r#"{"name": "m", "dense_features": 4, "embedding_dim": 8, "table_rows": [5],
        "bottom_mlp": [4, 8], "top_mlp": [1], "interaction": "dcn",
        "dcn_layers": 100000000, "dcn_low_rank": 2, "batch_size": 4, "learning_rate": 0.1}"#;
    let err = dlrm_json::ModelSpec::parse(src, "<inline>")
        .expect_err("refused")
        .to_string();
    assert!(err.contains("dcn_layers") && err.contains("1024"), "{err}");
}
