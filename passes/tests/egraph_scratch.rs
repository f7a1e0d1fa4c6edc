#![allow(clippy::unwrap_used)]
use dlrm_passes::egraph::{FuseOptions, fuse};
use dlrm_passes::{LossKind, TrainConfig};

#[test]
fn scratch() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/dlrm-tiny.json");
    let m = dlrm_json::load(&root).unwrap();
    let t = dlrm_passes::autodiff::autodiff(&m.graph, &TrainConfig { loss: LossKind::Bce, lr: 0.2 }).unwrap();
    let (g, st) = fuse(&t, &FuseOptions::default()).unwrap();
    println!("{}", dlrm_ir::text::print(&g));
    println!("{st:?}");
    dlrm_ir::verify(&g).unwrap();
}
