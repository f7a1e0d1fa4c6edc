//! Concrete tensors: row-major data with a shape and an element type.
//!
//! bf16 storage follows the IR's rule: values are rounded to nearest even when
//! stored ([`half::bf16::from_f32`] does exactly that) and widened exactly on load.

use crate::types::{DType, TensorType};
use half::bf16;

/// The elements of a tensor.
#[derive(Clone, Debug, PartialEq)]
pub enum Data {
    /// f32 elements.
    F32(Vec<f32>),
    /// bf16 elements.
    BF16(Vec<bf16>),
    /// i64 elements.
    I64(Vec<i64>),
    /// i32 elements.
    I32(Vec<i32>),
    /// Bytes (quantized tables).
    U8(Vec<u8>),
}

impl Data {
    /// The number of elements held.
    pub fn len(&self) -> usize {
        match self {
            Data::F32(v) => v.len(),
            Data::BF16(v) => v.len(),
            Data::I64(v) => v.len(),
            Data::I32(v) => v.len(),
            Data::U8(v) => v.len(),
        }
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            Data::F32(_) => DType::F32,
            Data::BF16(_) => DType::BF16,
            Data::I64(_) => DType::I64,
            Data::I32(_) => DType::I32,
            Data::U8(_) => DType::U8,
        }
    }

    /// A copy of the elements in `r`, or `None` when `r` is not in range.
    pub fn slice(&self, r: std::ops::Range<usize>) -> Option<Data> {
        Some(match self {
            Data::F32(v) => Data::F32(v.get(r)?.to_vec()),
            Data::BF16(v) => Data::BF16(v.get(r)?.to_vec()),
            Data::I64(v) => Data::I64(v.get(r)?.to_vec()),
            Data::I32(v) => Data::I32(v.get(r)?.to_vec()),
            Data::U8(v) => Data::U8(v.get(r)?.to_vec()),
        })
    }

    /// The bytes, if these are u8 elements.
    pub fn as_u8(&self) -> Option<&[u8]> {
        match self {
            Data::U8(v) => Some(v),
            _ => None,
        }
    }

    /// True when no element is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A dense row-major tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    /// Sizes, outermost first.
    pub shape: Vec<usize>,
    /// Elements; `data.len() == shape.iter().product()`.
    pub data: Data,
}

impl Tensor {
    /// An f32 tensor. Panics if the length does not match the shape (a programming
    /// error, not an input error).
    pub fn f32(shape: Vec<usize>, data: Vec<f32>) -> Tensor {
        assert_eq!(
            shape.iter().product::<usize>(),
            data.len(),
            "f32 tensor {shape:?}"
        );
        Tensor {
            shape,
            data: Data::F32(data),
        }
    }

    /// A bf16 tensor.
    pub fn bf16(shape: Vec<usize>, data: Vec<bf16>) -> Tensor {
        assert_eq!(
            shape.iter().product::<usize>(),
            data.len(),
            "bf16 tensor {shape:?}"
        );
        Tensor {
            shape,
            data: Data::BF16(data),
        }
    }

    /// An i64 tensor.
    pub fn i64(shape: Vec<usize>, data: Vec<i64>) -> Tensor {
        assert_eq!(
            shape.iter().product::<usize>(),
            data.len(),
            "i64 tensor {shape:?}"
        );
        Tensor {
            shape,
            data: Data::I64(data),
        }
    }

    /// An i32 tensor.
    pub fn i32(shape: Vec<usize>, data: Vec<i32>) -> Tensor {
        assert_eq!(
            shape.iter().product::<usize>(),
            data.len(),
            "i32 tensor {shape:?}"
        );
        Tensor {
            shape,
            data: Data::I32(data),
        }
    }

    /// A u8 tensor.
    pub fn u8(shape: Vec<usize>, data: Vec<u8>) -> Tensor {
        assert_eq!(
            shape.iter().product::<usize>(),
            data.len(),
            "u8 tensor {shape:?}"
        );
        Tensor {
            shape,
            data: Data::U8(data),
        }
    }

    /// A scalar f32.
    pub fn scalar(v: f32) -> Tensor {
        Tensor::f32(vec![], vec![v])
    }

    /// Zeros of a dtype and shape.
    pub fn zeros(dtype: DType, shape: Vec<usize>) -> Tensor {
        let n = shape.iter().product();
        let data = match dtype {
            DType::F32 => Data::F32(vec![0.0; n]),
            DType::BF16 => Data::BF16(vec![bf16::ZERO; n]),
            DType::I64 => Data::I64(vec![0; n]),
            DType::I32 => Data::I32(vec![0; n]),
            DType::U8 => Data::U8(vec![0; n]),
        };
        Tensor { shape, data }
    }

    /// Builds a float tensor of `dtype` from f32 values (rounding to nearest even for
    /// bf16).
    pub fn from_f32(dtype: DType, shape: Vec<usize>, values: Vec<f32>) -> Tensor {
        match dtype {
            DType::BF16 => Tensor::bf16(shape, values.into_iter().map(bf16::from_f32).collect()),
            _ => Tensor::f32(shape, values),
        }
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.data.dtype()
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Size in bytes of the elements.
    pub fn size_bytes(&self) -> usize {
        self.numel() * self.dtype().size_bytes()
    }

    /// The f32 elements, if this is an f32 tensor.
    pub fn as_f32(&self) -> Option<&[f32]> {
        match &self.data {
            Data::F32(v) => Some(v),
            _ => None,
        }
    }

    /// The f32 elements mutably, if this is an f32 tensor.
    pub fn as_f32_mut(&mut self) -> Option<&mut [f32]> {
        match &mut self.data {
            Data::F32(v) => Some(v),
            _ => None,
        }
    }

    /// The bytes, if this is a u8 tensor.
    pub fn as_u8(&self) -> Option<&[u8]> {
        self.data.as_u8()
    }

    /// The elements widened to f32 (floats only; indices are converted too, for
    /// convenience in tests).
    pub fn to_f32_vec(&self) -> Vec<f32> {
        match &self.data {
            Data::F32(v) => v.clone(),
            Data::BF16(v) => v.iter().map(|x| x.to_f32()).collect(),
            Data::I64(v) => v.iter().map(|&x| x as f32).collect(),
            Data::I32(v) => v.iter().map(|&x| x as f32).collect(),
            Data::U8(v) => v.iter().map(|&x| f32::from(x)).collect(),
        }
    }

    /// The elements as i64 (index tensors).
    pub fn to_i64_vec(&self) -> Option<Vec<i64>> {
        match &self.data {
            Data::I64(v) => Some(v.clone()),
            Data::I32(v) => Some(v.iter().map(|&x| i64::from(x)).collect()),
            _ => None,
        }
    }

    /// True if this tensor is an instance of `ty` under the symbol binding `bind`
    /// (dtype equal, every dimension equal to its fixed or bound size).
    pub fn matches(&self, ty: &TensorType, bind: &dyn Fn(&str) -> Option<usize>) -> bool {
        self.dtype() == ty.dtype
            && self.shape.len() == ty.shape.len()
            && self
                .shape
                .iter()
                .zip(&ty.shape)
                .all(|(&n, d)| d.resolve(bind) == Some(n))
    }
}
