//! Small ONNX models built in tests (no exporter is needed for a one-node graph),
//! and the importer's refusals of graphs that are well-formed protobuf but not
//! valid ONNX.

use crate::proto::tensor_proto::DataType;
use crate::proto::tensor_shape_proto::{Dimension, dimension};
use crate::proto::{
    GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorShapeProto, TypeProto,
    ValueInfoProto, type_proto,
};
use prost::Message;

/// A `[batch, 4]` tensor value of element type `elem`.
pub(crate) fn value(name: &str, elem: DataType) -> ValueInfoProto {
    let dims = [
        dimension::Value::DimParam("batch".into()),
        dimension::Value::DimValue(4),
    ];
    let shape = TensorShapeProto {
        dim: dims
            .into_iter()
            .map(|v| Dimension {
                value: Some(v),
                ..Default::default()
            })
            .collect(),
    };
    ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: Some(elem as i32),
                shape: Some(shape),
            })),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A node `op` named `name` from `input` to `output`.
pub(crate) fn node(op: &str, name: &str, input: &[&str], output: &[&str]) -> NodeProto {
    NodeProto {
        op_type: Some(op.into()),
        name: Some(name.into()),
        input: input.iter().map(|s| s.to_string()).collect(),
        output: output.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

/// An opset 20 model of `nodes` from `input` to `output`, encoded.
pub(crate) fn model(
    nodes: Vec<NodeProto>,
    input: Vec<ValueInfoProto>,
    output: Vec<ValueInfoProto>,
) -> Vec<u8> {
    ModelProto {
        ir_version: Some(9),
        opset_import: vec![OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(20),
        }],
        graph: Some(GraphProto {
            name: Some("g".into()),
            node: nodes,
            input,
            output,
            ..Default::default()
        }),
        ..Default::default()
    }
    .encode_to_vec()
}

fn import_err(bytes: &[u8]) -> String {
    crate::from_bytes(bytes, "m.onnx", None)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default()
}

#[test]
fn a_value_defined_twice_is_refused() {
    let f = DataType::Float;
    let nodes = vec![
        node("Relu", "a", &["x"], &["y"]),
        node("Sigmoid", "b", &["x"], &["y"]),
    ];
    let err = import_err(&model(nodes, vec![value("x", f)], vec![value("y", f)]));
    assert!(
        err.contains("node 1 (`Sigmoid`) defines `y`, which is already defined"),
        "{err}"
    );
    let nodes = vec![node("Relu", "a", &["x"], &["x"])];
    let err = import_err(&model(nodes, vec![value("x", f)], vec![value("x", f)]));
    assert!(
        err.contains("defines `x`, which is already defined"),
        "{err}"
    );
    let ok = vec![node("Relu", "a", &["x"], &["y"])];
    assert!(
        crate::from_bytes(
            &model(ok, vec![value("x", f)], vec![value("y", f)]),
            "m",
            None
        )
        .is_ok()
    );
}

#[test]
fn an_output_declared_int64_but_computed_as_float_is_refused() {
    let nodes = vec![node("Relu", "a", &["x"], &["y"])];
    let out = value("y", DataType::Int64);
    let err = import_err(&model(nodes, vec![value("x", DataType::Float)], vec![out]));
    assert!(
        err.contains("graph output `y` is declared INT64 (i64) but the graph computes it as f32"),
        "{err}"
    );
}
