//! The one wrapper every exported function runs its body in: a panic is
//! caught and becomes `NVML_ERROR_UNKNOWN` instead of unwinding into C
//! (which would abort the caller's process), and the simulator's locks
//! are taken as a monitoring query takes them
//! (`gpusim::Patience::Monitor`: NVML never waits for a process
//! someone froze).

use std::panic::{self, AssertUnwindSafe};

use crate::abi::Return;
use crate::error::{NvmlError, SUCCESS};

/// Runs `body` and turns its outcome into an `nvmlReturn_t`.
pub fn entry(body: impl FnOnce() -> Result<(), NvmlError>) -> Return {
    // AssertUnwindSafe: after a panic the library's shared state is behind
    // mutexes that recover from poisoning, and the caller's buffers are
    // left as partially written as any failed NVML call may leave them.
    let run = || gpusim::with_patience(gpusim::Patience::Monitor, body);
    match panic::catch_unwind(AssertUnwindSafe(run)) {
        Ok(Ok(())) => SUCCESS,
        Ok(Err(e)) => e.code(),
        Err(_) => NvmlError::Unknown.code(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn panics_become_unknown() {
        assert_eq!(entry(|| Ok(())), 0);
        assert_eq!(entry(|| Err(NvmlError::NotFound)), 6);
        assert_eq!(entry(|| panic!("boom")), 999);
    }
}
