//! The ops written as one module each ([`crate::module`]), and their list.

/// `attr_keys` and `check_attrs` of an op module without attributes.
macro_rules! no_attributes {
    () => {
        fn attr_keys(&self) -> &'static [&'static str] {
            &[]
        }

        fn check_attrs(
            &self,
            _: &[(&'static str, crate::op::Attr)],
        ) -> std::result::Result<(), String> {
            Ok(())
        }
    };
}

/// `update` of an op module that is not an optimizer update.
macro_rules! not_an_update {
    () => {
        fn update(&self, _: &crate::module::ModOp) -> Option<crate::module::OptimizerUpdate> {
            None
        }
    };
}

/// `onnx` and `onnx_import` of an op module that ONNX has no op for (its
/// decomposition is exported; no ONNX node imports as it).
macro_rules! no_onnx_form {
    () => {
        fn onnx(&self, _: &crate::module::ModOp) -> Option<crate::module::OnnxNode> {
            None
        }

        fn onnx_import(
            &self,
            _: &crate::module::OnnxNode,
        ) -> Option<std::result::Result<crate::module::ModOp, String>> {
            None
        }
    };
}

pub mod cross;
pub mod cross_brgemm;
pub mod cross_mix;
pub mod cross_saved;
pub mod embedding_bag_q8;
pub mod gelu;
pub mod interaction_blocked;
pub mod split_adagrad;

use crate::module::OpModule;

/// Every op module: the one list the parser, the e-graph and the kernels consult.
/// A mnemonic here must not also be in the op table (`op/table.rs`); a test checks.
pub static MODULES: &[&dyn OpModule] = &[
    &cross::Cross,
    &cross::CrossGrad,
    &cross_brgemm::CROSS_BRGEMM,
    &cross_brgemm::CROSS_BRGEMM_SAVE,
    &cross_brgemm::CrossBrgemmDgrad,
    &cross_mix::CrossMix,
    &cross_mix::CrossMixGrad,
    &cross_saved::CrossSave,
    &cross_saved::CrossGradSaved,
    &embedding_bag_q8::EmbeddingBagQ8,
    &gelu::Gelu,
    &gelu::GeluGrad,
    &interaction_blocked::InteractionBlocked,
    &interaction_blocked::InteractionGradBlocked,
    &split_adagrad::SplitAdagrad,
    &split_adagrad::SplitEmbeddingUpdateAdagrad,
];
