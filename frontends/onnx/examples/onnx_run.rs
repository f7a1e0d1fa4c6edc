//! Imports an ONNX model and runs it once through the reference interpreter:
//! `onnx_run MODEL.onnx INPUTS.npz OUTPUTS.npz [REPEATS]`. Prints the import time
//! and the run time per repeat (used by `scripts/compare-onnxruntime`). With
//! `DLRM_PRINT_IR` set, the imported graph's text form goes to stderr.

use dlrm_ir::interp::{bind_symbols, run};
use dlrm_ir::{SingleRank, Tensor};
use std::collections::HashMap;
use std::path::Path;
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 4 {
        return Err("usage: onnx_run MODEL.onnx INPUTS.npz OUTPUTS.npz [REPEATS]".into());
    }
    let repeats: usize = args.get(4).map_or(Ok(1), |s| s.parse())?;
    let t0 = Instant::now();
    let m = dlrm_onnx::load(Path::new(&args[1]))?;
    let import_s = t0.elapsed().as_secs_f64();
    if std::env::var_os("DLRM_PRINT_IR").is_some() {
        eprintln!("{}", dlrm_ir::text::print(&m.graph));
    }
    let ins: HashMap<String, Tensor> = dlrm_onnx::npz::read(Path::new(&args[2]))?
        .into_iter()
        .collect();
    let mut params: HashMap<String, Tensor> = m.params.iter().cloned().collect();
    let syms = bind_symbols(&m.graph, &ins, &params)?;
    let mut outs = Vec::new();
    let t1 = Instant::now();
    for _ in 0..repeats.max(1) {
        outs = run(&m.graph, &ins, &mut params, &syms, &SingleRank)?;
    }
    let run_s = t1.elapsed().as_secs_f64() / repeats.max(1) as f64;
    let named: Vec<(String, Tensor)> = m.outputs.iter().cloned().zip(outs).collect();
    dlrm_onnx::npz::write(Path::new(&args[3]), &named)?;
    println!("import_s {import_s:.6}");
    println!("run_s {run_s:.6}");
    println!("nodes {}", m.graph.nodes().len());
    Ok(())
}
