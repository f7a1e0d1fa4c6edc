#![expect(clippy::unwrap_used, reason = "tests fail loudly")]

use super::*;
use std::time::{Duration, Instant};

fn npy(dict: &str, payload: &[u8]) -> Vec<u8> {
    raw_npy(dict, payload).unwrap()
}

fn header(dict: &str) -> Result<Header, NpyError> {
    read_header(&mut &npy(dict, &[])[..])
}

#[test]
fn reads_a_numpy_header() {
    let dict = "{'descr': '<f8', 'fortran_order': True, 'shape': (3, 26), }";
    let h = header(dict).unwrap();
    assert_eq!((h.kind, h.size, h.fortran), (Kind::Float, 8, true));
    assert_eq!(h.shape, [3, 26]);
    assert_eq!(h.header_bytes as usize, npy(dict, &[]).len());
    let h = header("{'descr': '|b1', 'fortran_order': False, 'shape': (5,), }").unwrap();
    assert_eq!((h.kind, h.shape.as_slice()), (Kind::Bool, &[5u64][..]));
    assert_eq!(
        header("{'descr': '>i4', 'fortran_order': False, 'shape': ()}")
            .unwrap()
            .elements()
            .unwrap(),
        1
    );
}

#[test]
fn nested_braces_are_refused_at_once() {
    let dict = format!("{{'descr': {}", "{".repeat(30));
    let t = Instant::now();
    let e = header(&dict).unwrap_err().to_string();
    assert!(t.elapsed() < Duration::from_millis(10), "{:?}", t.elapsed());
    assert!(e.contains("expected a string"), "{e}");
    let e = header(&"{".repeat(30)).unwrap_err().to_string();
    assert!(e.contains("expected a string"), "{e}");
}

#[test]
fn long_headers_and_many_dimensions_are_refused() {
    let mut b = MAGIC.to_vec();
    b.extend([2, 0]);
    b.extend(u32::MAX.to_le_bytes());
    let e = read_header(&mut &b[..]).unwrap_err().to_string();
    assert!(e.contains("4294967295 bytes") && e.contains("10000"), "{e}");
    let dims = vec!["1"; MAX_DIMS + 1].join(", ");
    let e = header(&format!(
        "{{'descr': '<f4', 'fortran_order': False, 'shape': ({dims})}}"
    ))
    .unwrap_err()
    .to_string();
    assert!(e.contains("more than 32 dimensions"), "{e}");
}

#[test]
fn declared_sizes_are_checked_against_the_bytes_present() {
    let h =
        header("{'descr': '|u1', 'fortran_order': False, 'shape': (1099511627776,), }").unwrap();
    let e = h.check_present(4).unwrap_err().to_string();
    assert!(
        e.contains("[1099511627776]") && e.contains("1099511627776 payload bytes, 4 present"),
        "{e}"
    );
    let h = header("{'descr': '<f8', 'fortran_order': False, 'shape': (18446744073709551615,), }")
        .unwrap();
    let e = h.check_present(4).unwrap_err().to_string();
    assert!(e.contains("overflows 64 bits"), "{e}");
    let h = header("{'descr': '<i4', 'fortran_order': False, 'shape': (4294967296, 4294967296), }")
        .unwrap();
    assert!(
        h.check_present(0)
            .unwrap_err()
            .to_string()
            .contains("overflows")
    );
    let h = header("{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }").unwrap();
    let e = h.check_present(12).unwrap_err().to_string();
    assert!(
        e.contains("8 payload bytes, 12 present (bytes past the declared shape)"),
        "{e}"
    );
    assert_eq!(h.check_present(8).unwrap(), 2);
}

#[test]
fn payloads_are_read_in_order_and_must_end_where_declared() {
    let bytes = npy(
        "{'descr': '<i2', 'fortran_order': False, 'shape': (2,), }",
        &[1, 0, 0xff, 0xff, 7],
    );
    let mut r = &bytes[..];
    let h = read_header(&mut r).unwrap();
    let mut got = Vec::new();
    let e = read_payload(&mut r, &h, 2, |_, v| {
        got.push(v);
        Ok::<_, ()>(())
    });
    assert_eq!(got, [Value::Int(1), Value::Int(-1)]);
    match e {
        Err(PayloadError::Npy(e)) => assert!(e.to_string().contains("bytes past"), "{e}"),
        other => panic!("{other:?}"),
    }
    let mut short = &[1u8, 0][..];
    let e = read_payload(&mut short, &h, 2, |_, _| Ok::<_, ()>(()));
    assert!(matches!(e, Err(PayloadError::Npy(e)) if e.to_string().contains("ends early")));
}

#[test]
fn odd_headers_are_refused() {
    for (dict, want) in [
        (
            "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,)}",
            "expected a string",
        ),
        (
            "{'descr': '<c8', 'fortran_order': False, 'shape': (1,)}",
            "unsupported dtype `<c8`",
        ),
        (
            "{'descr': '<f4', 'fortran_order': 1, 'shape': (1,)}",
            "not a bool",
        ),
        (
            "{'descr': '<f4', 'fortran_order': False, 'shape': (-1,)}",
            "`-1` is not a count",
        ),
        ("{'descr': '<f4', 'shape': (1,)}", "needs descr"),
        ("{'descr': '<f4', 'extra': 1}", "unknown key `extra`"),
        (
            "{'descr': '<f4', 'fortran_order': False, 'shape': (1,)} x",
            "text after",
        ),
    ] {
        let e = header(dict).unwrap_err().to_string();
        assert!(e.contains(want), "{dict}: {e}");
    }
}

#[test]
fn duplicate_members_are_found() {
    let mut cd = Vec::new();
    for name in ["a.npy", "b.npy", "a.npy"] {
        let mut e = vec![0u8; 46];
        e[..4].copy_from_slice(&[0x50, 0x4b, 0x01, 0x02]);
        e[28..30].copy_from_slice(&(name.len() as u16).to_le_bytes());
        e.extend(name.as_bytes());
        cd.extend(e);
    }
    let mut r = std::io::Cursor::new(cd);
    assert_eq!(
        duplicate_member(&mut r, 0, 2).unwrap().as_deref(),
        Some("a.npy")
    );
    assert_eq!(duplicate_member(&mut r, 0, 1).unwrap(), None);
}
