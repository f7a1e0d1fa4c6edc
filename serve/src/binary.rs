//! The binary tensor data extension of the Open Inference Protocol (as Triton
//! defines it, and `tritonclient` uses it by default).
//!
//! Request: with the header `Inference-Header-Content-Length: N`, the body's
//! first `N` bytes are the JSON request and the rest holds, one after another in
//! input order, the raw little-endian elements of every input whose
//! `parameters.binary_data_size` gives its byte count (the others carry JSON
//! `data`). Every size is checked against the input's shape and datatype and
//! the bytes against the body, errors naming the input.
//!
//! Response: an output is answered in binary when the request asks for it (the
//! output's `parameters.binary_data`, else the request's
//! `parameters.binary_data_output`): its JSON tensor carries
//! `parameters.binary_data_size` and no `data`, its bytes follow the JSON in
//! output order, and the answer's `Inference-Header-Content-Length` gives the
//! JSON's length.

use crate::protocol::{
    InferRequest, InferResponse, RequestTensor, ResponseTensor, checked_shape, datatype_of,
    from_tensor, to_tensor,
};
use dlrm_ir::{DType, Data, Tensor};
use serde_json::{Value, json};

/// The header giving the JSON part's length.
pub const HEADER: &str = "inference-header-content-length";

/// An inference request's JSON and its input tensors, from a body whose JSON
/// part is `json_len` bytes long (`None`: all of it).
pub fn parse(
    body: &[u8],
    json_len: Option<usize>,
) -> Result<(InferRequest, Vec<(String, Tensor)>), String> {
    let n = json_len.unwrap_or(body.len());
    if n > body.len() {
        return Err(format!(
            "Inference-Header-Content-Length {n} is past the body's {} bytes",
            body.len()
        ));
    }
    let (head, mut rest) = body.split_at(n);
    let req: InferRequest =
        serde_json::from_slice(head).map_err(|e| format!("malformed request: {e}"))?;
    let mut tensors = Vec::with_capacity(req.inputs.len());
    let mut offset = n;
    for t in &req.inputs {
        let x = match t.parameters.get("binary_data_size") {
            None => to_tensor(t)?,
            Some(size) => {
                let size = size
                    .as_u64()
                    .and_then(|s| usize::try_from(s).ok())
                    .ok_or_else(|| {
                        format!(
                            "input `{}`: binary_data_size {size} is not a byte count",
                            t.name
                        )
                    })?;
                if size > rest.len() {
                    return Err(format!(
                        "input `{}`: binary_data_size {size} at byte {offset} is past the \
                         body's {} bytes",
                        t.name,
                        body.len()
                    ));
                }
                let (bytes, tail) = rest.split_at(size);
                rest = tail;
                offset += size;
                from_bytes(t, bytes)?
            }
        };
        tensors.push((t.name.clone(), x));
    }
    if !rest.is_empty() {
        return Err(format!(
            "{} bytes of binary data follow the last input's (the inputs' \
             binary_data_size sum to {})",
            rest.len(),
            offset - n
        ));
    }
    Ok((req, tensors))
}

/// Input `t`'s elements from their little-endian `bytes`.
fn from_bytes(t: &RequestTensor, bytes: &[u8]) -> Result<Tensor, String> {
    let (shape, n) = checked_shape(t)?;
    let width = match t.datatype.as_str() {
        "FP32" | "INT32" => 4,
        "FP64" | "INT64" => 8,
        other => {
            return Err(format!(
                "input `{}`: datatype `{other}` is not supported (FP32, FP64, INT64, INT32)",
                t.name
            ));
        }
    };
    if bytes.len() != n * width {
        return Err(format!(
            "input `{}`: binary_data_size {} does not fit shape {:?} of {} ({n} elements of \
             {width} bytes)",
            t.name,
            bytes.len(),
            t.shape,
            t.datatype
        ));
    }
    let words = bytes.chunks_exact(width);
    let w4 = |c: &[u8]| [c[0], c[1], c[2], c[3]];
    let w8 = |c: &[u8]| [c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]];
    Ok(match t.datatype.as_str() {
        "FP32" => Tensor::f32(shape, words.map(|c| f32::from_le_bytes(w4(c))).collect()),
        "FP64" => Tensor::f32(
            shape,
            words.map(|c| f64::from_le_bytes(w8(c)) as f32).collect(),
        ),
        "INT32" => Tensor::i32(shape, words.map(|c| i32::from_le_bytes(w4(c))).collect()),
        _ => Tensor::i64(shape, words.map(|c| i64::from_le_bytes(w8(c))).collect()),
    })
}

/// `t`'s elements as little-endian bytes (bf16 widened to FP32, as the metadata
/// declares).
fn to_bytes(t: &Tensor, out: &mut Vec<u8>) {
    match &t.data {
        Data::I64(v) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        Data::I32(v) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        _ => t
            .to_f32_vec()
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
    }
}

/// True when output `name` is to be answered in binary (module docs).
fn wants_binary(req: &InferRequest, name: &str) -> bool {
    let flag = |p: &serde_json::Map<String, Value>, k: &str| p.get(k).and_then(Value::as_bool);
    req.outputs
        .iter()
        .find(|o| o.name == name)
        .and_then(|o| flag(&o.parameters, "binary_data"))
        .or_else(|| flag(&req.parameters, "binary_data_output"))
        .unwrap_or(false)
}

/// The answer's body and, when some output is binary, its JSON part's length.
pub fn respond(
    req: &InferRequest,
    model_name: &str,
    model_version: &str,
    outputs: &[(String, Tensor)],
) -> (Vec<u8>, Option<usize>) {
    let wanted = |n: &str| req.outputs.is_empty() || req.outputs.iter().any(|o| o.name == n);
    let mut bin = Vec::new();
    let tensors: Vec<ResponseTensor> = outputs
        .iter()
        .filter(|(n, _)| wanted(n))
        .map(|(n, t)| {
            if !wants_binary(req, n) {
                return from_tensor(n, t);
            }
            let before = bin.len();
            to_bytes(t, &mut bin);
            let dtype = if t.dtype() == DType::BF16 {
                DType::F32
            } else {
                t.dtype()
            };
            ResponseTensor {
                name: n.clone(),
                shape: t.shape.clone(),
                datatype: datatype_of(dtype),
                data: None,
                parameters: Some(json!({ "binary_data_size": bin.len() - before })),
            }
        })
        .collect();
    let resp = InferResponse {
        model_name: model_name.to_string(),
        model_version: model_version.to_string(),
        id: req.id.clone(),
        outputs: tensors,
    };
    // Serializing plain strings, numbers and arrays cannot fail.
    let mut body = serde_json::to_vec(&resp).unwrap_or_default();
    if bin.is_empty() && !req.outputs.iter().any(|o| wants_binary(req, &o.name)) {
        return (body, None);
    }
    let n = body.len();
    body.extend_from_slice(&bin);
    (body, Some(n))
}

#[cfg(test)]
mod tests {
    #![expect(clippy::unwrap_used, reason = "tests fail loudly")]
    use super::*;

    fn body(json: &Value, bin: &[u8]) -> (Vec<u8>, usize) {
        let mut b = json.to_string().into_bytes();
        let n = b.len();
        b.extend_from_slice(bin);
        (b, n)
    }

    #[test]
    fn binary_inputs_mixed_with_json_and_their_errors() {
        let mut bin = Vec::new();
        [1.5f32, -2.0]
            .iter()
            .for_each(|x| bin.extend(x.to_le_bytes()));
        [7i64].iter().for_each(|x| bin.extend(x.to_le_bytes()));
        let req = json!({"inputs": [
            {"name": "d", "shape": [1, 2], "datatype": "FP32", "parameters": {"binary_data_size": 8}},
            {"name": "j", "shape": [1], "datatype": "INT32", "data": [3]},
            {"name": "i", "shape": [1], "datatype": "INT64", "parameters": {"binary_data_size": 8}},
        ]});
        let (b, n) = body(&req, &bin);
        let (_, t) = parse(&b, Some(n)).unwrap();
        assert_eq!(t[0].1, Tensor::f32(vec![1, 2], vec![1.5, -2.0]));
        assert_eq!(t[1].1, Tensor::i32(vec![1], vec![3]));
        assert_eq!(t[2].1, Tensor::i64(vec![1], vec![7]));
        let e = parse(&b[..b.len() - 1], Some(n)).unwrap_err();
        assert!(e.contains("input `i`: binary_data_size 8 at byte"), "{e}");
        let mut extra = b.clone();
        extra.push(0);
        assert!(
            parse(&extra, Some(n))
                .unwrap_err()
                .contains("1 bytes of binary data follow")
        );
        assert!(
            parse(&b, Some(b.len() + 1))
                .unwrap_err()
                .contains("past the body")
        );
        let bad = json!({"inputs": [
            {"name": "d", "shape": [1, 3], "datatype": "FP32", "parameters": {"binary_data_size": 8}},
        ]});
        let (b, n) = body(&bad, &bin[..8]);
        let e = parse(&b, Some(n)).unwrap_err();
        assert!(
            e.contains("input `d`: binary_data_size 8 does not fit shape [1, 3]"),
            "{e}"
        );
    }

    #[test]
    fn binary_outputs_follow_the_json() {
        let req: InferRequest = serde_json::from_value(json!({
            "inputs": [], "parameters": {"binary_data_output": true}
        }))
        .unwrap();
        let outs = vec![("p".to_string(), Tensor::f32(vec![2, 1], vec![0.25, 0.5]))];
        let (b, n) = respond(&req, "m", "1", &outs);
        let n = n.unwrap();
        let head: Value = serde_json::from_slice(&b[..n]).unwrap();
        assert_eq!(head["outputs"][0]["parameters"]["binary_data_size"], 8);
        assert!(head["outputs"][0].get("data").is_none());
        assert_eq!(&b[n..n + 4], &0.25f32.to_le_bytes());
        let json_req: InferRequest = serde_json::from_value(json!({"inputs": []})).unwrap();
        let (b, n) = respond(&json_req, "m", "1", &outs);
        assert!(n.is_none());
        let v: Value = serde_json::from_slice(&b).unwrap();
        assert_eq!(v["outputs"][0]["data"], json!([0.25, 0.5]));
    }
}
