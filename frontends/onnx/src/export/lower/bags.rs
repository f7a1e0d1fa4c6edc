//! Embedding bags to ONNX: the rows gathered (`Gather`), then pooled: a fixed
//! pooling `[S, L]` by `ReduceSum`/`ReduceMean` over `L`, bags given by offsets
//! by the segment sum of `patterns.rs`; a weighted bag's rows scaled first.
//!
//! An int8 row-wise table (`embedding_bag_q8`, FBGEMM's fused rows `u8[R, D+8]`)
//! is written as three initializers, its codes `uint8[R, D]`, scales and biases
//! `float[R, 1]` (the fused bytes split, nothing rounded), and the rows a bag
//! reads are dequantized after the gather: `Cast(codes) · scale + bias`
//! (`Mul` then `Add`: one rounding more than the IR's fused multiply-add, a
//! relative difference of at most 2⁻²⁴ per element).

use super::super::builder::{A, InitData};
use super::{Fail, Lower, Repr, fixed};
use dlrm_ir::ops::embedding_bag_q8::{SCALE_BIAS_BYTES, scale_bias};
use dlrm_ir::{Node, Pool, TensorType, ValueId};
use std::borrow::Cow;

impl Lower<'_, '_> {
    /// A whole-table embedding bag (`node.op.bag_form()` is `Some`): its
    /// result's representation.
    pub(super) fn bag(
        &mut self,
        node: &Node,
        hint: &str,
        out_ty: &TensorType,
    ) -> Result<Repr, Fail> {
        let form = node.op.bag_form().ok_or("not an embedding bag")?;
        let ins = &node.inputs;
        let inp = |k: usize| -> Result<ValueId, Fail> {
            ins.get(k)
                .copied()
                .ok_or_else(|| format!("missing operand {k}"))
        };
        let idx = self.plain(inp(1)?)?;
        let weighted = ins.len() == 4;
        if form.last_offset && ins.len() != 3 {
            return Err(format!(
                "a last-offset bag takes 3 operands, got {}",
                ins.len()
            ));
        }
        // The bags' index positions and offsets (PyTorch's include_last_offset=True:
        // the bags read indices[off[0] .. off[S]] with the offsets off[..S] - off[0],
        // the plain form over those indices).
        let bags = match ins.len() {
            2 => None,
            3 | 4 => {
                let off = self.plain(inp(2)?)?;
                Some(match form.last_offset {
                    true => self.last_offset_bags(&idx, &off, hint),
                    false => (idx.clone(), off),
                })
            }
            n => return Err(format!("an embedding bag takes 2 to 4 operands, got {n}")),
        };
        let at = bags.as_ref().map_or(&idx, |(i, _)| i).clone();
        let mut rows = match form.int8 {
            true => self.int8_rows(inp(0)?, &at, hint)?,
            false => {
                let t = self.plain(inp(0)?)?;
                let h = format!("{hint}.rows");
                self.b
                    .node("Gather", &[&t, &at], vec![("axis", A::Int(0))], &h)
            }
        };
        if weighted {
            let w = self.plain(inp(3)?)?;
            let ax = self.b.ints(&[1]);
            let w1 = self
                .b
                .node("Unsqueeze", &[&w, &ax], vec![], &format!("{hint}.w"));
            rows = self
                .b
                .node("Mul", &[&rows, &w1], vec![], &format!("{hint}.scaled"));
        }
        let y = match bags {
            None => self.reduce(&rows, form.mode, &[1], false, hint),
            Some((i, off)) => {
                let d = fixed(&out_ty.shape[1], "the embedding width")?;
                let mode = if weighted { Pool::Sum } else { form.mode };
                self.segment(&rows, &i, &off, d, mode, hint)
            }
        };
        Ok(Repr::Plain(self.round(y, out_ty.dtype, hint)))
    }

    /// The f32 rows of the int8 table `t` at the indices `at` (module docs).
    fn int8_rows(&mut self, t: ValueId, at: &str, hint: &str) -> Result<String, Fail> {
        let [codes, scale, bias] = self.int8_table(t)?;
        let gather = |l: &mut Self, x: &str, what: &str| {
            l.b.node(
                "Gather",
                &[x, at],
                vec![("axis", A::Int(0))],
                &format!("{hint}.{what}"),
            )
        };
        let q = gather(self, &codes, "codes");
        let s = gather(self, &scale, "scale");
        let b = gather(self, &bias, "bias");
        let to = (
            "to",
            A::Int(crate::proto::tensor_proto::DataType::Float as i64),
        );
        let f = self
            .b
            .node("Cast", &[&q], vec![to], &format!("{hint}.codes_f32"));
        let p = self
            .b
            .node("Mul", &[&f, &s], vec![], &format!("{hint}.scaled_codes"));
        Ok(self
            .b
            .node("Add", &[&p, &b], vec![], &format!("{hint}.rows")))
    }

    /// The initializers of an int8 table (written once): codes, scales, biases.
    fn int8_table(&mut self, t: ValueId) -> Result<[String; 3], Fail> {
        if let Some(n) = self.int8.get(&t) {
            return Ok(n.clone());
        }
        if !matches!(self.repr.get(&t), Some(Repr::Param(_))) {
            return Err(format!(
                "the int8 table `%{}` is not a parameter",
                self.g.name_of(t)
            ));
        }
        let tensor = self.param_tensor(t)?;
        let (bytes, &[rows, w]) = (
            tensor.as_u8().ok_or("an int8 table is not u8")?,
            &tensor.shape[..],
        ) else {
            return Err(format!("an int8 table has shape {:?}", tensor.shape));
        };
        let d = w
            .checked_sub(SCALE_BIAS_BYTES)
            .ok_or("an int8 row is too short")?;
        let mut codes = Vec::with_capacity(rows * d);
        let (mut scales, mut biases) = (Vec::with_capacity(rows), Vec::with_capacity(rows));
        for row in bytes.chunks_exact(w) {
            codes.extend_from_slice(&row[..d]);
            let (s, b) = scale_bias(row);
            scales.push(s);
            biases.push(b);
        }
        let name = self.g.name_of(t).to_string();
        let names = [
            self.b.init(
                &format!("{name}.codes"),
                &[rows, d],
                InitData::U8(Cow::Owned(codes)),
            ),
            self.b.init(
                &format!("{name}.scale"),
                &[rows, 1],
                InitData::F32(Cow::Owned(scales)),
            ),
            self.b.init(
                &format!("{name}.bias"),
                &[rows, 1],
                InitData::F32(Cow::Owned(biases)),
            ),
        ];
        self.int8.insert(t, names.clone());
        Ok(names)
    }
}
