//! Errors of the region crate.

use std::path::PathBuf;

pub use tessera_error_chain::PathIoError;

/// Why a region could not be used.
#[derive(Debug, thiserror::Error)]
pub enum RegionError {
    /// A field holds a value this ABI does not accept.
    #[error("{region} region: {field} {problem}")]
    Field {
        /// `control` or `usage`.
        region: &'static str,
        /// The field, e.g. `owners[3]` or `used[0][12]`.
        field: String,
        /// What is wrong with it.
        problem: String,
    },
    /// A file operation failed: `cannot {action} {path}`.
    #[error(transparent)]
    Io(#[from] PathIoError),
    /// Every process slot is taken by a live process.
    #[error("usage region {path} has no free process slot ({slots} in use)")]
    Full {
        /// The usage file.
        path: PathBuf,
        /// Slots.
        slots: usize,
    },
}

impl RegionError {
    /// A field error.
    pub fn field(
        region: &'static str,
        field: impl Into<String>,
        problem: impl Into<String>,
    ) -> Self {
        Self::Field {
            region,
            field: field.into(),
            problem: problem.into(),
        }
    }
}
