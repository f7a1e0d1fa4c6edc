//! The Open Inference Protocol's (KServe v2) JSON messages and their tensors.
//!
//! A request tensor is `{"name", "shape", "datatype", "data"}`: `data` holds the
//! elements in row-major order, flat or nested as the shape (both are accepted, as
//! Triton does). `shape` is a claim: its element count is checked (without
//! overflow) against the elements present and against [`MAX_ELEMENTS`] before
//! anything is allocated. Datatypes: `FP32`, `FP64` (stored as f32), `INT64`,
//! `INT32`. Every error names the input and, for a bad element, its position.

use dlrm_ir::{DType, Tensor};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The most elements one request tensor may hold.
pub const MAX_ELEMENTS: usize = 1 << 28;

/// The deepest nesting of a tensor's `data` accepted.
const MAX_DEPTH: usize = 16;

/// `POST /v2/models/{name}/infer`'s body.
#[derive(Debug, Deserialize)]
pub struct InferRequest {
    /// The request's id, echoed back.
    #[serde(default)]
    pub id: Option<String>,
    /// The input tensors.
    pub inputs: Vec<RequestTensor>,
    /// The outputs wanted (all when absent).
    #[serde(default)]
    pub outputs: Vec<RequestedOutput>,
    /// Request parameters: `timeout` (microseconds), `binary_data_output`.
    #[serde(default)]
    pub parameters: Map<String, Value>,
}

/// One input tensor of a request.
#[derive(Debug, Deserialize)]
pub struct RequestTensor {
    /// The model input's name.
    pub name: String,
    /// Its shape.
    pub shape: Vec<i64>,
    /// `FP32`, `FP64`, `INT64` or `INT32`.
    pub datatype: String,
    /// Its elements, row-major, flat or nested (absent when they are binary).
    #[serde(default)]
    pub data: Value,
    /// Tensor parameters: `binary_data_size` (the binary tensor extension).
    #[serde(default)]
    pub parameters: Map<String, Value>,
}

/// An output a request asks for.
#[derive(Debug, Deserialize)]
pub struct RequestedOutput {
    /// The output's name.
    pub name: String,
    /// Output parameters: `binary_data` (answer it in binary).
    #[serde(default)]
    pub parameters: Map<String, Value>,
}

/// The answer to an inference request.
#[derive(Debug, Serialize)]
pub struct InferResponse {
    /// The model's name.
    pub model_name: String,
    /// The version of the model that answered (a checkpoint's step; "1" for a plan).
    pub model_version: String,
    /// The request's id, if it had one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The output tensors.
    pub outputs: Vec<ResponseTensor>,
}

/// One output tensor of a response.
#[derive(Debug, Serialize)]
pub struct ResponseTensor {
    /// The output's name.
    pub name: String,
    /// Its shape.
    pub shape: Vec<usize>,
    /// Its datatype.
    pub datatype: &'static str,
    /// Its elements, row-major, flat (absent when they are binary).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<Vec<Value>>,
    /// `binary_data_size` when the elements follow the JSON in binary.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Value>,
}

/// A tensor's name, datatype and shape in the model metadata (`-1` for a
/// dimension that varies: the batch, a bag's id count).
#[derive(Clone, Debug, Serialize)]
pub struct TensorMetadata {
    /// The name.
    pub name: String,
    /// The datatype (`FP32`, `INT64`, ...).
    pub datatype: String,
    /// The shape.
    pub shape: Vec<i64>,
}

/// The protocol's name of a dtype.
pub fn datatype_of(d: DType) -> &'static str {
    match d {
        DType::F32 => "FP32",
        DType::BF16 => "BF16",
        DType::I64 => "INT64",
        DType::I32 => "INT32",
        DType::U8 => "UINT8",
    }
}

/// The metadata of a tensor of IR type text `ty` (e.g. `i64[3,B]`).
pub fn metadata_of(name: &str, ty: &str) -> TensorMetadata {
    let (dt, dims) = ty.split_once('[').unwrap_or((ty, "]"));
    let datatype = DType::from_mnemonic(dt)
        .map_or("BYTES", datatype_of)
        .to_string();
    let shape = dims
        .trim_end_matches(']')
        .split(',')
        .filter(|d| !d.is_empty())
        .map(|d| d.trim().parse::<i64>().unwrap_or(-1))
        .collect();
    TensorMetadata {
        name: name.to_string(),
        datatype,
        shape,
    }
}

/// Appends the elements of `v` (a number or nested arrays of them) to `out`
/// through `elem`, stopping at `limit` elements.
fn flatten<T>(
    v: &Value,
    depth: usize,
    limit: usize,
    out: &mut Vec<T>,
    elem: &dyn Fn(&Value, usize) -> Result<T, String>,
) -> Result<(), String> {
    match v {
        Value::Array(items) => {
            if depth >= MAX_DEPTH {
                return Err(format!("`data` is nested deeper than {MAX_DEPTH} levels"));
            }
            for item in items {
                flatten(item, depth + 1, limit, out, elem)?;
            }
            Ok(())
        }
        other => {
            if out.len() >= limit {
                return Err(format!(
                    "`data` holds more than the shape's {limit} elements"
                ));
            }
            let x = elem(other, out.len())?;
            out.push(x);
            Ok(())
        }
    }
}

/// The elements of a request tensor as `T`, checked against `n` (the shape's
/// count).
fn elements<T>(
    t: &RequestTensor,
    n: usize,
    elem: &dyn Fn(&Value, usize) -> Result<T, String>,
) -> Result<Vec<T>, String> {
    let mut out = Vec::with_capacity(n.min(1 << 20));
    flatten(&t.data, 0, n, &mut out, elem)?;
    if out.len() != n {
        return Err(format!(
            "`data` holds {} elements, but shape {:?} needs {n}",
            out.len(),
            t.shape
        ));
    }
    Ok(out)
}

/// A request tensor's shape and element count, checked (module docs).
pub fn checked_shape(t: &RequestTensor) -> Result<(Vec<usize>, usize), String> {
    let named = |e: String| format!("input `{}`: {e}", t.name);
    let mut shape = Vec::with_capacity(t.shape.len());
    let mut n: usize = 1;
    for &d in &t.shape {
        let d = usize::try_from(d)
            .map_err(|_| named(format!("shape {:?} has a negative dimension", t.shape)))?;
        n = n
            .checked_mul(d)
            .filter(|&n| n <= MAX_ELEMENTS)
            .ok_or_else(|| {
                named(format!(
                    "shape {:?} holds more than {MAX_ELEMENTS} elements",
                    t.shape
                ))
            })?;
        shape.push(d);
    }
    Ok((shape, n))
}

/// A request tensor as an IR tensor (module docs); errors name the input.
pub fn to_tensor(t: &RequestTensor) -> Result<Tensor, String> {
    let named = |e: String| format!("input `{}`: {e}", t.name);
    let (shape, n) = checked_shape(t)?;
    let float = |v: &Value, i: usize| {
        v.as_f64()
            .map(|x| x as f32)
            .ok_or_else(|| format!("element {i} is {v}, not a number"))
    };
    let int = |v: &Value, i: usize| {
        v.as_i64()
            .ok_or_else(|| format!("element {i} is {v}, not an integer"))
    };
    match t.datatype.as_str() {
        _ if t.data.is_null() => Err(named(
            "no `data` (nor a `binary_data_size` parameter with the binary tensor extension)"
                .to_string(),
        )),
        "FP32" | "FP64" => Ok(Tensor::f32(shape, elements(t, n, &float).map_err(named)?)),
        "INT64" => Ok(Tensor::i64(shape, elements(t, n, &int).map_err(named)?)),
        "INT32" => {
            let v = elements(t, n, &int).map_err(named)?;
            let v = v
                .into_iter()
                .enumerate()
                .map(|(i, x)| {
                    i32::try_from(x).map_err(|_| format!("element {i} ({x}) does not fit INT32"))
                })
                .collect::<Result<Vec<i32>, String>>()
                .map_err(named)?;
            Ok(Tensor::i32(shape, v))
        }
        other => Err(named(format!(
            "datatype `{other}` is not supported (FP32, FP64, INT64, INT32)"
        ))),
    }
}

/// An IR tensor as a response tensor with JSON data.
pub fn from_tensor(name: &str, t: &Tensor) -> ResponseTensor {
    let data = match t.to_i64_vec() {
        Some(v) if t.dtype().is_int() => v.into_iter().map(Value::from).collect(),
        _ => t
            .to_f32_vec()
            .into_iter()
            .map(|x| Value::from(f64::from(x)))
            .collect(),
    };
    ResponseTensor {
        name: name.to_string(),
        shape: t.shape.clone(),
        datatype: datatype_of(if t.dtype() == DType::BF16 {
            DType::F32
        } else {
            t.dtype()
        }),
        data: Some(data),
        parameters: None,
    }
}

#[cfg(test)]
mod tests {
    #![expect(clippy::unwrap_used, reason = "tests fail loudly")]
    use super::*;

    fn req(shape: Vec<i64>, datatype: &str, data: Value) -> RequestTensor {
        RequestTensor {
            name: "x".into(),
            shape,
            datatype: datatype.into(),
            data,
            parameters: Map::new(),
        }
    }

    #[test]
    fn tensors_flat_or_nested_and_their_errors() {
        let flat = to_tensor(&req(vec![2, 2], "FP32", serde_json::json!([1, 2, 3, 4]))).unwrap();
        let nested = to_tensor(&req(
            vec![2, 2],
            "FP32",
            serde_json::json!([[1, 2], [3, 4]]),
        ))
        .unwrap();
        assert_eq!(flat, nested);
        assert_eq!(flat, Tensor::f32(vec![2, 2], vec![1.0, 2.0, 3.0, 4.0]));
        let ids = to_tensor(&req(vec![3], "INT64", serde_json::json!([0, 5, 9]))).unwrap();
        assert_eq!(ids, Tensor::i64(vec![3], vec![0, 5, 9]));
        for (t, want) in [
            (
                req(vec![3], "FP32", serde_json::json!([1, 2])),
                "holds 2 elements, but shape [3] needs 3",
            ),
            (
                req(vec![1], "FP32", serde_json::json!([1, 2])),
                "more than the shape's 1 elements",
            ),
            (
                req(vec![2], "INT64", serde_json::json!([1, 2.5])),
                "element 1 is 2.5, not an integer",
            ),
            (
                req(vec![-1], "FP32", serde_json::json!([])),
                "negative dimension",
            ),
            (
                req(vec![1 << 20, 1 << 20], "FP32", serde_json::json!([])),
                "more than",
            ),
            (
                req(vec![1], "STRING", serde_json::json!(["a"])),
                "datatype `STRING`",
            ),
            (
                req(vec![1], "INT32", serde_json::json!([1i64 << 40])),
                "does not fit INT32",
            ),
        ] {
            let e = to_tensor(&t).unwrap_err();
            assert!(e.contains(want) && e.starts_with("input `x`"), "{e}");
        }
        let deep = (0..40).fold(serde_json::json!(1), |v, _| serde_json::json!([v]));
        assert!(
            to_tensor(&req(vec![1], "FP32", deep))
                .unwrap_err()
                .contains("nested deeper")
        );
    }

    #[test]
    fn metadata_marks_varying_dims() {
        let m = metadata_of("offsets", "i64[3,B]");
        assert_eq!((m.datatype.as_str(), m.shape), ("INT64", vec![3, -1]));
        let m = metadata_of("dense_x", "f32[B,13]");
        assert_eq!((m.datatype.as_str(), m.shape), ("FP32", vec![-1, 13]));
    }
}
