//! dlrm-ir: the intermediate representation of dlrmc.
//!
//! A [`Graph`] is a typed SSA tensor graph: inputs (data fed each step), parameters
//! (persistent state), nodes in execution order, outputs, and the state updates an
//! optimizer step makes. Every op is an [`Op`]; [`infer()`] derives result
//! types; [`verify()`] checks a whole graph; [`text`] prints and parses the one text
//! form (grammar in `docs/ir.md`); [`interp`] is the reference interpreter whose
//! behaviour defines every op, collectives included (over a [`Communicator`]).

#![warn(missing_docs)]

mod comm;
pub mod contract;
pub mod dim;
pub mod dot;
mod error;
mod graph;
mod infer;
pub mod init;
mod instance;
pub mod interp;
mod local_group;
pub mod module;
mod op;
pub mod ops;
mod tensor;
pub mod text;
mod types;
mod verify;

pub use comm::{Communicator, SingleRank, batch_slice};
pub use dim::DimExpr;
pub use error::{IrError, Result};
pub use graph::{Def, Graph, Node, Update, Value, ValueId};
pub use infer::{infer, interaction_width};
pub use init::{Blocking, Described, Init, OnDemand, ParamValue, Part, RowSource};
pub use instance::{Checked, CheckedMut, Concrete, NodeInstance, stored_len};
pub use local_group::{AllReduceAlgo, LocalComm, LocalGroup, SMALL_ALLREDUCE};
pub use module::gemm_flops;
pub use op::{
    A2aDir, Act, AdagradHyper, Attr, BagUpdate, BinaryKind, InteractionKind, MNEMONICS, Op, Pool,
    State,
};
pub use tensor::{Data, Tensor};
pub use types::{DType, Dim, Shape, TensorType};
pub use verify::verify;
