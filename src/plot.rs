//! `dlrmc plot`: learning curves from `--metrics` files: the training loss, the
//! validation AUC and the validation log loss over steps, one panel each, several
//! runs overlaid with a legend (each run labelled by its file's stem), as one SVG.
//!
//! A metrics file's lines are told apart by their keys: a line with `split` is an
//! evaluation (`iter`, `auc`, `log_loss`), one with `iter` and a numeric `loss` a
//! training step; other lines (the summary) are skipped.

use crate::error::{Error, Result};
use plotters::prelude::*;
use std::path::{Path, PathBuf};

/// One run's curves.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Curves {
    /// The legend label (the file's stem).
    pub label: String,
    /// `(step, loss)` of the logged training steps.
    pub loss: Vec<(f64, f64)>,
    /// `(step, AUC)` of the evaluations during training.
    pub auc: Vec<(f64, f64)>,
    /// `(step, log loss)` of the evaluations during training.
    pub log_loss: Vec<(f64, f64)>,
}

fn plot_err(path: &Path, reason: impl std::fmt::Display) -> Error {
    Error::Options(format!("{}: {reason}", path.display()))
}

/// Reads a metrics file's curves (evaluations of split `split` only).
pub fn read_curves(path: &Path, split: &str) -> Result<Curves> {
    let text = std::fs::read_to_string(path).map_err(|e| plot_err(path, e))?;
    let mut c = Curves {
        label: path.file_stem().map_or_else(
            || path.display().to_string(),
            |s| s.to_string_lossy().into_owned(),
        ),
        ..Curves::default()
    };
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let v: serde_json::Value = serde_json::from_str(line)
            .map_err(|e| plot_err(path, format!("line {}: {e}", n + 1)))?;
        let Some(iter) = v.get("iter").and_then(serde_json::Value::as_f64) else {
            continue;
        };
        match v.get("split").and_then(serde_json::Value::as_str) {
            Some(s) if s == split => {
                if let Some(a) = v["auc"].as_f64() {
                    c.auc.push((iter, a));
                }
                if let Some(l) = v["log_loss"].as_f64() {
                    c.log_loss.push((iter, l));
                }
            }
            Some(_) => {}
            None => {
                if let Some(l) = v.get("loss").and_then(serde_json::Value::as_f64) {
                    c.loss.push((iter, l));
                }
            }
        }
    }
    if c.loss.is_empty() && c.auc.is_empty() {
        return Err(plot_err(
            path,
            format!(
                "no training loss and no `{split}` evaluation lines (a dlrm-run --metrics file?)"
            ),
        ));
    }
    Ok(c)
}

/// The range of `ys` with a margin (a flat curve gets ±0.05).
fn span(ys: impl Iterator<Item = f64>) -> std::ops::Range<f64> {
    let (lo, hi) = ys.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), y| {
        (a.min(y), b.max(y))
    });
    if !lo.is_finite() {
        return 0.0..1.0;
    }
    let pad = ((hi - lo) * 0.05).max(0.05);
    lo - pad..hi + pad
}

/// Draws `runs` into the SVG file `out` (see the module docs).
pub fn plot(runs: &[Curves], out: &Path) -> Result<()> {
    let err = |e: &dyn std::fmt::Display| plot_err(out, e);
    let root = SVGBackend::new(out, (900, 1050)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let panels = root.split_evenly((3, 1));
    let max_step = runs
        .iter()
        .flat_map(|r| r.loss.iter().chain(&r.auc).map(|p| p.0))
        .fold(1.0, f64::max);
    type Pick = fn(&Curves) -> &Vec<(f64, f64)>;
    let what: [(&str, Pick); 3] = [
        ("training loss", |c| &c.loss),
        ("validation AUC", |c| &c.auc),
        ("validation log loss", |c| &c.log_loss),
    ];
    for (area, (title, pick)) in panels.iter().zip(what) {
        let ys = span(runs.iter().flat_map(|r| pick(r).iter().map(|p| p.1)));
        let mut chart = ChartBuilder::on(area)
            .caption(title, ("sans-serif", 22))
            .margin(12)
            .x_label_area_size(35)
            .y_label_area_size(60)
            .build_cartesian_2d(0.0..max_step, ys)
            .map_err(|e| err(&e))?;
        chart
            .configure_mesh()
            .x_desc("step")
            .draw()
            .map_err(|e| err(&e))?;
        for (i, r) in runs.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            chart
                .draw_series(LineSeries::new(
                    pick(r).iter().copied(),
                    color.stroke_width(2),
                ))
                .map_err(|e| err(&e))?
                .label(r.label.as_str())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(|e| err(&e))?;
    }
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

/// `dlrmc plot FILES -o OUT`: reads every file's curves and draws them.
pub fn plot_files(files: &[PathBuf], split: &str, out: &Path) -> Result<()> {
    let runs = files
        .iter()
        .map(|f| read_curves(f, split))
        .collect::<Result<Vec<_>>>()?;
    plot(&runs, out)
}
