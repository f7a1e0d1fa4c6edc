//! `dlrmc inspect`'s text: the summary of a plan or checkpoint
//! ([`dlrm_compiler::inspect`], which computes it and whose types are re-exported
//! here) printed as `dlrmc inspect` shows it ([`Text`]; `--json` prints the
//! summary's own serialisation).

pub use dlrm_compiler::inspect::*;
use std::fmt;

/// An [`Inspection`] as text (its [`fmt::Display`]).
pub struct Text<'a>(pub &'a Inspection);

/// The input contract's lines.
struct Inputs<'a>(&'a InputsSummary);

impl fmt::Display for Inputs<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "inputs ({}):", self.0.layout)?;
        if !self.0.model_inputs.is_empty() {
            let list: Vec<String> = self
                .0
                .model_inputs
                .iter()
                .map(|(n, t)| format!("{n}: {t}"))
                .collect();
            writeln!(f, "  the model's own: {}", list.join(", "))?;
        }
        for i in &self.0.graph_inputs {
            let from = i
                .from
                .as_deref()
                .map_or(String::new(), |s| format!("  <- {s}"));
            let name = format!("%{}", i.name);
            writeln!(f, "  {name:<20} {:<16} {}{from}", i.ty, i.role)?;
        }
        Ok(())
    }
}

fn human_bytes(b: usize) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

impl fmt::Display for Text<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let i = self.0;
        let t = &i.training;
        writeln!(f, "plan `{}` ({} precision)", i.name, i.precision)?;
        if let Some(c) = &i.checkpoint {
            let bytes: u64 = c.files.iter().map(|f| f.1).sum();
            writeln!(
                f,
                "checkpoint {}: after step {} of {}, seed {}, global batch {}, written by {} rank{}",
                c.path,
                c.step,
                c.last_step,
                c.seed,
                c.global_batch,
                c.ranks,
                if c.ranks == 1 { "" } else { "s" }
            )?;
            writeln!(
                f,
                "  data: {} (next data step {}), learning rate: {}",
                c.data.source,
                c.data.next_data_step,
                c.lr_schedule.map_or_else(
                    || "the compiled rates".to_string(),
                    |s| serde_json::to_string(&s).unwrap_or_default()
                )
            )?;
            writeln!(
                f,
                "  {} parameters in {} pieces, {} files, {}; plan sha256 {}",
                c.tensors,
                c.pieces,
                c.files.len(),
                human_bytes(bytes as usize),
                c.plan_sha256
            )?;
        }
        writeln!(
            f,
            "training: loss {}, optimizer {}, learning rate {}, batch {}, seed {}",
            t.loss, t.optimizer, t.learning_rate, t.batch_size, t.seed
        )?;
        writeln!(f)?;
        write!(f, "{}", Inputs(&i.inputs))?;
        for (which, s) in &i.graphs {
            let nodes: usize = s.ops.values().sum();
            writeln!(f)?;
            writeln!(
                f,
                "{which} graph: {nodes} nodes, {:.3} MFLOP per sample",
                s.flops_per_sample / 1e6
            )?;
            for (op, n) in &s.ops {
                writeln!(f, "  {op:<22} {n:>6}")?;
            }
        }
        writeln!(f)?;
        writeln!(f, "parameters ({} graph):", i.default_graph)?;
        for (dt, n) in &i.stats.params {
            let bytes = i.stats.param_bytes.get(dt).copied().unwrap_or(0);
            writeln!(f, "  {dt:<6} {n:>14} elements {:>12}", human_bytes(bytes))?;
        }
        Ok(())
    }
}
