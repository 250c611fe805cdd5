//! The exported C entry points of `libcuda.so.1`.
//!
//! Every entry point is declared through [`cu_export!`], which
//! - exports it unmangled with the C ABI and the real driver API signature;
//! - runs its body under `catch_unwind`, so a panic becomes
//!   `CUDA_ERROR_UNKNOWN` and never unwinds into C;
//! - turns the body's `Result<(), CUresult>` into the return code.
//!
//! Pointer arguments are only touched through the helpers in [`ptr`], which
//! reject NULL with `CUDA_ERROR_INVALID_VALUE`. Beyond NULL, the caller
//! must pass pointers that are valid as the driver API documents; that is
//! the contract of every function here.

pub mod ptr;

mod array;
mod context;
mod device;
mod export_table;
mod graph;
mod init;
mod launch;
mod memory;
mod module;
mod stream;
mod vmm;

pub use array::*;
pub use context::*;
pub use device::*;
pub use export_table::*;
pub use graph::*;
pub use init::*;
pub use launch::*;
pub use memory::*;
pub use module::*;
pub use stream::*;
pub use vmm::*;

use std::panic::{AssertUnwindSafe, catch_unwind};

use crate::status::{CUDA_ERROR_UNKNOWN, CUDA_SUCCESS, CUresult};

/// Runs an entry point's body, converting its result and catching panics.
pub fn guard(f: impl FnOnce() -> Result<(), CUresult>) -> CUresult {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => CUDA_SUCCESS,
        Ok(Err(code)) => code,
        Err(_) => CUDA_ERROR_UNKNOWN,
    }
}

/// [`guard`] for entry point `name`: with `GPUSIM_TRACE=1` in the
/// environment, each call's name and result go to stderr.
pub fn traced(name: &'static str, f: impl FnOnce() -> Result<(), CUresult>) -> CUresult {
    let code = guard(f);
    if trace_enabled() {
        let text = crate::status::name(code)
            .map(|n| String::from_utf8_lossy(&n[..n.len() - 1]).into_owned())
            .unwrap_or_else(|| code.to_string());
        eprintln!("gpusim-trace: {name} -> {text}");
    }
    code
}

/// Whether `GPUSIM_TRACE=1` (read once).
pub fn trace_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("GPUSIM_TRACE").is_some_and(|v| v == "1"))
}

/// Defines exported driver API functions. The body is a block returning
/// `Result<(), CUresult>`, run under [`guard`]. It is not wrapped in
/// `unsafe`: each unsafe operation in it (a pointer helper from [`ptr`], a
/// dereference) has its own `unsafe {}` block with a `// SAFETY:` reason
/// naming the part of the caller's contract it relies on.
macro_rules! cu_export {
    ($( $(#[$m:meta])* fn $name:ident ( $($arg:ident : $ty:ty),* $(,)? ) $body:block )*) => {
        $(
            $(#[$m])*
            #[cfg_attr(not(test), unsafe(no_mangle))]
            #[allow(non_snake_case, clippy::missing_safety_doc)]
            pub unsafe extern "C" fn $name($($arg: $ty),*) -> $crate::status::CUresult {
                $crate::exports::traced(stringify!($name), move || $body)
            }
        )*
    };
}

/// Defines exported aliases (per-thread-stream and versioned names) that
/// forward to an entry point with the same signature.
macro_rules! cu_alias {
    ($( $alias:ident => $target:ident ( $($arg:ident : $ty:ty),* $(,)? ); )*) => {
        $(
            #[cfg_attr(not(test), unsafe(no_mangle))]
            #[allow(non_snake_case, clippy::missing_safety_doc)]
            pub unsafe extern "C" fn $alias($($arg: $ty),*) -> $crate::status::CUresult {
                // SAFETY: same contract as the target, which takes the same
                // arguments.
                unsafe { $target($($arg),*) }
            }
        )*
    };
}

pub(crate) use {cu_alias, cu_export};

/// A handle as the C side sees it.
pub fn h(x: crate::abi::Handle) -> u64 {
    x as u64
}

/// A handle for the C side.
pub fn hp(x: u64) -> crate::abi::Handle {
    x as crate::abi::Handle
}

/// `CUresult` → `Result`, for entry points that forward to another.
pub trait Code {
    /// `Ok` for `CUDA_SUCCESS`, else the code.
    fn ok(self) -> Result<(), CUresult>;
}

impl Code for CUresult {
    fn ok(self) -> Result<(), CUresult> {
        if self == CUDA_SUCCESS {
            Ok(())
        } else {
            Err(self)
        }
    }
}
