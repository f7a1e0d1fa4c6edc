//! The multi-node ONNX forms of two IR ops: bags given by offsets (a segment
//! sum without `Loop`) and the dot interaction (PyTorch's export of the reference
//! DLRM's `interact_features`).

use super::builder::{A, InitData, scalar_f32_tensor};
use super::lower::Lower;
use crate::proto::tensor_proto::DataType;
use dlrm_ir::Pool;

impl Lower<'_, '_> {
    /// Bags given by offsets: `rows[N,D]` (the gathered, maybe weighted, rows)
    /// summed per bag into `[S,D]` (mean: divided by the bag's length, empty bags 0).
    ///
    /// The bag of each index is `cumsum(marks)[i] - 1`, where `marks[N+1]` counts
    /// the offsets equal to each position (`ScatterElements` with `add`); the rows
    /// are then added into zeros `[S,D]` at their bag by `ScatterND` with `add`,
    /// in index order. No `Loop`.
    /// The indices and offsets of the plain form of `last_offset` bags over
    /// `idx` with offsets `off[S+1]`: `idx[off[0] .. off[S]]` and
    /// `off[..S] - off[0]` (int64), so that the first bag starts at 0 and the
    /// last ends at the end of the indices.
    pub(crate) fn last_offset_bags(
        &mut self,
        idx: &str,
        off: &str,
        hint: &str,
    ) -> (String, String) {
        let b = &mut self.b;
        let off64 = b.node(
            "Cast",
            &[off],
            vec![("to", A::Int(DataType::Int64 as i64))],
            &format!("{hint}.off_all"),
        );
        let (ax0, one, minus1, big) = (
            b.ints(&[0]),
            b.ints(&[1]),
            b.ints(&[-1]),
            b.ints(&[i64::MAX]),
        );
        let first = b.node(
            "Slice",
            &[&off64, &ax0, &one, &ax0],
            vec![],
            &format!("{hint}.first"),
        );
        let last = b.node(
            "Slice",
            &[&off64, &minus1, &big, &ax0],
            vec![],
            &format!("{hint}.last"),
        );
        let used = b.node(
            "Slice",
            &[idx, &first, &last, &ax0],
            vec![],
            &format!("{hint}.used"),
        );
        let head = b.node(
            "Slice",
            &[&off64, &ax0, &minus1, &ax0],
            vec![],
            &format!("{hint}.starts"),
        );
        let rel = b.node("Sub", &[&head, &first], vec![], &format!("{hint}.starts0"));
        (used, rel)
    }

    pub(crate) fn segment(
        &mut self,
        rows: &str,
        idx: &str,
        off: &str,
        d: usize,
        mode: Pool,
        hint: &str,
    ) -> String {
        let b = &mut self.b;
        let off64 = b.node(
            "Cast",
            &[off],
            vec![("to", A::Int(DataType::Int64 as i64))],
            &format!("{hint}.off"),
        );
        let n = b.node("Shape", &[idx], vec![], &format!("{hint}.n"));
        let one = b.ints(&[1]);
        let n1 = b.node("Add", &[&n, &one], vec![], &format!("{hint}.n1"));
        let zero = A::Tensor(scalar_f32_tensor(0.0));
        let z = b.node(
            "ConstantOfShape",
            &[&n1],
            vec![("value", zero)],
            &format!("{hint}.zeros_n"),
        );
        let s = b.node("Shape", &[off], vec![], &format!("{hint}.s"));
        let ones = b.node(
            "ConstantOfShape",
            &[&s],
            vec![("value", A::Tensor(scalar_f32_tensor(1.0)))],
            &format!("{hint}.ones"),
        );
        let marks = b.node(
            "ScatterElements",
            &[&z, &off64, &ones],
            vec![("axis", A::Int(0)), ("reduction", A::Str("add"))],
            &format!("{hint}.marks"),
        );
        let ax0 = b.ints(&[0]);
        let cs = b.node("CumSum", &[&marks, &ax0], vec![], &format!("{hint}.cumsum"));
        let minus1 = b.ints(&[-1]);
        let csn = b.node(
            "Slice",
            &[&cs, &ax0, &minus1, &ax0],
            vec![],
            &format!("{hint}.cumsum_n"),
        );
        let onef = b.float(1.0);
        let segf = b.node("Sub", &[&csn, &onef], vec![], &format!("{hint}.bag_f"));
        let seg = b.node(
            "Cast",
            &[&segf],
            vec![("to", A::Int(DataType::Int64 as i64))],
            &format!("{hint}.bag_i"),
        );
        let seg2 = b.node("Unsqueeze", &[&seg, &one], vec![], &format!("{hint}.bag"));
        let dd = b.ints(&[d as i64]);
        let sd = b.node(
            "Concat",
            &[&s, &dd],
            vec![("axis", A::Int(0))],
            &format!("{hint}.sd"),
        );
        let zsd = b.node(
            "ConstantOfShape",
            &[&sd],
            vec![("value", A::Tensor(scalar_f32_tensor(0.0)))],
            &format!("{hint}.zeros"),
        );
        let sum_hint = if mode == Pool::Sum {
            hint.to_string()
        } else {
            format!("{hint}.sum")
        };
        let sum = b.node(
            "ScatterND",
            &[&zsd, &seg2, rows],
            vec![("reduction", A::Str("add"))],
            &sum_hint,
        );
        if mode == Pool::Sum {
            return sum;
        }
        // Lengths: offsets[1:] ++ [N], minus offsets; at least 1 (empty bags are 0).
        let big = b.ints(&[i64::MAX]);
        let tail = b.node(
            "Slice",
            &[&off64, &one, &big, &ax0],
            vec![],
            &format!("{hint}.ends0"),
        );
        let ends = b.node(
            "Concat",
            &[&tail, &n],
            vec![("axis", A::Int(0))],
            &format!("{hint}.ends"),
        );
        let len = b.node("Sub", &[&ends, &off64], vec![], &format!("{hint}.len"));
        let lenf = b.node(
            "Cast",
            &[&len],
            vec![("to", A::Int(DataType::Float as i64))],
            &format!("{hint}.len_f"),
        );
        let onef = b.float(1.0);
        let len1 = b.node("Max", &[&lenf, &onef], vec![], &format!("{hint}.len1"));
        let len2 = b.node("Unsqueeze", &[&len1, &one], vec![], &format!("{hint}.len2"));
        b.node("Div", &[&sum, &len2], vec![], hint)
    }

    /// The dot interaction as PyTorch exports the reference DLRM's
    /// `interact_features`: `T = reshape[S,F,D](concat(x, e..))`, `Z = T·Tᵀ`,
    /// the strict (or with `self_interaction`, non-strict) lower triangle gathered
    /// flat from `Z` in row-major order (`i·F + j`), then `concat(x, ·)`.
    pub(crate) fn dot(
        &mut self,
        parts: &[String],
        d: usize,
        self_interaction: bool,
        hint: &str,
    ) -> String {
        let f = parts.len();
        let b = &mut self.b;
        let refs: Vec<&str> = parts.iter().map(String::as_str).collect();
        let cat = b.node(
            "Concat",
            &refs,
            vec![("axis", A::Int(1))],
            &format!("{hint}.cat"),
        );
        let s3 = b.ints(&[-1, f as i64, d as i64]);
        let t = b.node("Reshape", &[&cat, &s3], vec![], &format!("{hint}.T"));
        let tt = b.node(
            "Transpose",
            &[&t],
            vec![("perm", A::Ints(vec![0, 2, 1]))],
            &format!("{hint}.Tt"),
        );
        let z = b.node("MatMul", &[&t, &tt], vec![], &format!("{hint}.Z"));
        let s2 = b.ints(&[-1, (f * f) as i64]);
        let zf = b.node("Reshape", &[&z, &s2], vec![], &format!("{hint}.Zflat"));
        let mut tri = Vec::new();
        for i in 0..f {
            for j in 0..i + usize::from(self_interaction) {
                tri.push((i * f + j) as i64);
            }
        }
        let idx = b.init(&format!("{hint}.tril"), &[tri.len()], InitData::I64(tri));
        let zl = b.node(
            "Gather",
            &[&zf, &idx],
            vec![("axis", A::Int(1))],
            &format!("{hint}.Zlow"),
        );
        b.node("Concat", &[&parts[0], &zl], vec![("axis", A::Int(1))], hint)
    }
}
