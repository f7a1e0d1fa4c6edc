//! A plan's tables as int8 rows for serving ([`Plan::quantize_tables`]): the
//! `quantize-tables` pass on the inference graph
//! (`dlrm_passes::quantize`) and each such table's values quantized
//! (`dlrm_ir::ops::embedding_bag_q8::quantize_rows`, FBGEMM's bytes) from its
//! f32 values: a Split-SGD-BF16 table's from its two halves joined (the exact
//! f32 master), not from its bf16 half alone.

use super::Plan;
use crate::error::{Result, RuntimeError};
use dlrm_ir::ops::embedding_bag_q8::{SCALE_BIAS_BYTES, quantize_rows};
use dlrm_ir::{DType, Data, ParamValue, Tensor};
use dlrm_passes::quantize::{QuantizedTable, quantize_tables};
use std::collections::HashSet;

/// What [`Plan::quantize_tables`] did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct QuantizeReport {
    /// The tables stored as int8 rows.
    pub tables: Vec<QuantizedTable>,
    /// Their bytes as they were (f32 or bf16).
    pub bytes_before: u64,
    /// Their bytes as int8 rows (codes, scale and bias).
    pub bytes_after: u64,
}

impl QuantizeReport {
    /// One line for a log: tables, bytes before and after.
    pub fn summary(&self) -> String {
        let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
        let ratio = if self.bytes_before > 0 {
            self.bytes_after as f64 / self.bytes_before as f64
        } else {
            1.0
        };
        format!(
            "int8 row-wise tables: {} table{}, {:.1} MiB -> {:.1} MiB ({:.1}% of the bytes)",
            self.tables.len(),
            if self.tables.len() == 1 { "" } else { "s" },
            mib(self.bytes_before),
            mib(self.bytes_after),
            100.0 * ratio
        )
    }
}

impl Plan {
    /// This plan with its inference graph's bag tables stored as int8 rows
    /// (module docs) and their values quantized; inference only (the training
    /// graph and the parameters only it reads are dropped). A table holding a
    /// NaN or an infinity is an error naming it.
    pub fn quantize_tables(self) -> Result<(Plan, QuantizeReport)> {
        let (infer, tables) = quantize_tables(&self.infer)
            .map_err(|e| RuntimeError::Options(format!("--quantize-tables int8: {e}")))?;
        let declared: HashSet<&str> = infer.params().iter().map(|&p| infer.name_of(p)).collect();
        let mut report = QuantizeReport::default();
        let mut params = Vec::with_capacity(self.params.len());
        for (name, value) in &self.params {
            if !declared.contains(name.as_str()) {
                continue;
            }
            let Some(t) = tables.iter().find(|t| &t.param == name) else {
                params.push((name.clone(), value.clone()));
                continue;
            };
            let lo = self
                .params
                .iter()
                .find(|(n, _)| *n == format!("{name}.lo"))
                .map(|(_, v)| v);
            let values = f32_values(name, value, lo)?;
            let q = quantize_rows(&values, t.dim).map_err(|e| RuntimeError::Param {
                name: name.clone(),
                reason: format!("cannot quantize to int8 rows: {e}"),
            })?;
            report.bytes_before += (t.rows * t.dim * t.was.size_bytes()) as u64;
            report.bytes_after += t.bytes();
            let shape = vec![t.rows, t.dim + SCALE_BIAS_BYTES];
            params.push((name.clone(), ParamValue::Stored(Tensor::u8(shape, q))));
        }
        report.tables = tables;
        let plan = Plan {
            infer,
            train: None,
            params,
            ..self
        };
        Ok((plan, report))
    }
}

/// A table's values as f32: a bf16 table joined with its Split-SGD-BF16 low
/// halves `lo` when the plan has them.
fn f32_values(name: &str, value: &ParamValue, lo: Option<&ParamValue>) -> Result<Vec<f32>> {
    let t = value.materialize(name)?;
    if let (DType::BF16, Some(lo)) = (t.dtype(), lo) {
        let lo = lo.materialize(&format!("{name}.lo"))?;
        if let (Data::BF16(hi), Data::BF16(lo)) = (&t.data, &lo.data)
            && hi.len() == lo.len()
        {
            return Ok(hi
                .iter()
                .zip(lo)
                .map(|(h, l)| f32::from_bits(u32::from(h.to_bits()) << 16 | u32::from(l.to_bits())))
                .collect());
        }
    }
    Ok(t.to_f32_vec())
}
