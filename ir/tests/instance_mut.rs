//! `NodeInstance::bind_mut`: the operands of an in-place update (the parameters
//! it writes, then the others) checked against the update's instance, built once
//! from the declared types under a binding.

use dlrm_ir::{DType, Data, Dim, NodeInstance, Op, Pool, Tensor, TensorType};
use std::collections::HashMap;

fn syms() -> HashMap<String, usize> {
    HashMap::from([("B".to_string(), 2)])
}

/// `embedding_update(table[4,3], dy[B,3], indices[B,2])`.
fn update_instance() -> NodeInstance {
    let table = TensorType::f32([Dim::Fixed(4), Dim::Fixed(3)]);
    let dy = TensorType::f32([Dim::batch(), Dim::Fixed(3)]);
    let idx = TensorType::new(DType::I64, [Dim::batch(), Dim::Fixed(2)]);
    let op = Op::EmbeddingUpdate {
        mode: Pool::Sum,
        lr: 0.1,
    };
    NodeInstance::new(&op, &[table.clone(), dy, idx], &[table], &syms()).expect("instance")
}

#[test]
fn an_update_binds_its_parameters_and_operands() {
    let inst = update_instance();
    let mut ps = vec![Tensor::f32(vec![4, 3], vec![1.0; 12])];
    let dy = Tensor::f32(vec![2, 3], vec![0.5; 6]);
    let idx = Tensor::i64(vec![2, 2], vec![0, 1, 2, 3]);
    let mut c = inst.bind_mut(&mut ps, &[&dy, &idx]).expect("bound");
    assert_eq!(c.name(), "embedding_update");
    assert_eq!(c.in_shape(0), &[4, 3]);
    assert_eq!(c.in_shape(2), &[2, 2]);
    assert_eq!(c.rest().len(), 2);
    // The parameters are writable through the checked operands.
    let (params, rest) = c.split();
    params[0] = Tensor::f32(vec![4, 3], vec![2.0; 12]);
    assert_eq!(rest[0].shape, vec![2, 3]);
    assert_eq!(c.params()[0].to_f32_vec(), vec![2.0; 12]);
}

#[test]
fn what_does_not_fit_the_instance_is_refused_naming_the_operand() {
    let inst = update_instance();
    let table = Tensor::f32(vec![4, 3], vec![1.0; 12]);
    let dy = Tensor::f32(vec![2, 3], vec![0.5; 6]);
    let idx = Tensor::i64(vec![2, 2], vec![0, 1, 2, 3]);
    // Another batch size (the instance is for B = 2).
    let dy3 = Tensor::f32(vec![3, 3], vec![0.5; 9]);
    let e = inst
        .bind_mut(&mut [table.clone()], &[&dy3, &idx])
        .expect_err("B = 3");
    assert!(e.starts_with("`embedding_update`: operand 1"), "{e}");
    // A table of another width.
    let wide = Tensor::f32(vec![4, 4], vec![1.0; 16]);
    let e = inst
        .bind_mut(&mut [wide], &[&dy, &idx])
        .expect_err("4 columns");
    assert!(e.contains("operand 0"), "{e}");
    // A short buffer.
    let short = Tensor {
        shape: vec![4, 3],
        data: Data::F32(vec![1.0; 11]),
    };
    let e = inst
        .bind_mut(&mut [short], &[&dy, &idx])
        .expect_err("11 elements");
    assert!(e.contains("holds 11 elements"), "{e}");
    // A missing operand, and the table passed as an operand that is not updated.
    let e = inst
        .bind_mut(&mut [table.clone()], &[&dy])
        .expect_err("2 operands");
    assert!(e.contains("operands given"), "{e}");
    let e = inst
        .bind_mut(&mut [], &[&table, &dy, &idx])
        .expect_err("no parameter");
    assert!(e.contains("parameters given"), "{e}");
}

#[test]
fn a_two_parameter_update_binds_both() {
    // Split-SGD-BF16: the high and low halves are both updated.
    let ty = TensorType::new(DType::BF16, [Dim::Fixed(2), Dim::Fixed(2)]);
    let g = TensorType::f32([Dim::Fixed(2), Dim::Fixed(2)]);
    let op = Op::SplitSgd { lr: 0.5 };
    let inst = NodeInstance::new(
        &op,
        &[ty.clone(), ty.clone(), g],
        &[ty.clone(), ty],
        &HashMap::new(),
    )
    .expect("instance");
    let half = Tensor::from_f32(DType::BF16, vec![2, 2], vec![1.0; 4]);
    let g = Tensor::f32(vec![2, 2], vec![1.0; 4]);
    let mut ps = vec![half.clone(), half.clone()];
    assert!(inst.bind_mut(&mut ps, &[&g]).is_ok());
    let e = inst
        .bind_mut(&mut ps[..1], &[&half, &g])
        .expect_err("one half as a parameter");
    assert!(e.contains("the op updates 2"), "{e}");
}
