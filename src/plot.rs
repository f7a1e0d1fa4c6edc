//! `dlrmc plot`: learning curves from `--metrics` files: the training loss, the
//! validation AUC and the validation log loss over steps, one panel each, several
//! runs overlaid with a legend (each run labelled by its file's stem), as one SVG.
//!
//! The curves are read by the runtime, which writes the file
//! ([`dlrm_runtime::metrics::read_curves`]); this draws them.

use crate::{Error, Result};
pub use dlrm_runtime::metrics::{Curves, read_curves};
use plotters::prelude::*;
use std::path::{Path, PathBuf};

fn plot_err(path: &Path, reason: impl std::fmt::Display) -> Error {
    Error::Options(format!("{}: {reason}", path.display()))
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
        .collect::<dlrm_runtime::Result<Vec<_>>>()?;
    plot(&runs, out)
}
