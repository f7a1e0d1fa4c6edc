//! The stand-in [`MpiComm`] of a build without the `mpi` cargo feature (candle's
//! pattern): the same API as the real one (`mpi_comm.rs`), so callers need no
//! `cfg`; [`MpiComm::init`] fails with a clear error and no value of the type can
//! exist, so its [`Communicator`] methods are never reached.

use crate::error::{Result, RuntimeError};
use dlrm_ir::Communicator;
use std::convert::Infallible;

/// This process's rank of an MPI job — not in this build (no `mpi` feature).
pub struct MpiComm(Infallible);

impl MpiComm {
    /// Always fails: this build has no MPI support.
    pub fn init() -> Result<MpiComm> {
        Err(RuntimeError::NoMpi)
    }

    /// False: this build has no MPI support.
    pub const fn available() -> bool {
        false
    }
}

impl Communicator for MpiComm {
    fn rank(&self) -> usize {
        match self.0 {}
    }
    fn size(&self) -> usize {
        match self.0 {}
    }
    fn all_reduce_sum(&self, _data: &mut [f32]) -> dlrm_ir::Result<()> {
        match self.0 {}
    }
    fn all_to_all_v(&self, _send: Vec<Vec<f32>>) -> dlrm_ir::Result<Vec<Vec<f32>>> {
        match self.0 {}
    }
    fn barrier(&self) -> dlrm_ir::Result<()> {
        match self.0 {}
    }
    fn abort(&self, _reason: &str) {
        match self.0 {}
    }
}
