//! The exported hooks: CUDA driver API and NVML functions with the real
//! names and signatures, plus `dlsym`.
//!
//! Every hook is declared through [`hook!`], which exports it unmangled
//! with the C ABI and runs its body under `catch_unwind`: a panic becomes
//! `CUDA_ERROR_UNKNOWN` (or the NVML equivalent) and never unwinds into C.
//!
//! How a program reaches a hook:
//! - linked against libcuda/libnvidia-ml: the preloaded library's exports
//!   come first in symbol lookup;
//! - `dlsym(handle, "cuMemAlloc_v2")`: the `dlsym` hook answers with the
//!   hook when the name is in [`table`] (see `dlsym.rs`);
//! - `cuGetProcAddress[_v2]`: the real driver picks the variant for the
//!   caller's version and flags, and the hook swaps the real address for
//!   the hook of that same variant (see `init.rs`).

mod array;
mod context;
mod dlsym;
mod graph;
mod info;
mod init;
mod launch;
mod legacy;
mod memory;
mod nvml;
mod pool;
mod vmm;

pub use array::*;
pub use context::*;
pub use graph::*;
pub use info::*;
pub use init::*;
pub use launch::*;
pub use legacy::*;
pub use memory::*;
pub use nvml::*;
pub use pool::*;
pub use vmm::*;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::Ordering;

#[cfg(test)]
use crate::ffi::CUDA_ERROR_UNKNOWN;
use crate::ffi::{CUDA_ERROR_NOT_INITIALIZED, CUDA_ERROR_NOT_PERMITTED, CUresult};
use crate::state::{Enforcer, FORKED, Mode, mode};

/// Runs a hook body, turning a panic into `on_panic`. Inlined into the
/// hook, so that the launch fast path keeps the hook's arguments in
/// registers (`catch_unwind` itself costs nothing until a panic).
#[inline(always)]
pub fn guard<R>(on_panic: R, f: impl FnOnce() -> R) -> R {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(on_panic)
}

/// Runs `enforce` when limits apply, `pass` (the real call) under a
/// fail-open policy, and answers `refused` when GPU use is refused.
pub fn dispatch_as<R>(
    refused: R,
    pass: impl FnOnce() -> R,
    enforce: impl FnOnce(&'static Enforcer) -> R,
) -> R {
    match mode() {
        Mode::Enforce(e) => enforce(e),
        Mode::PassThrough => pass(),
        Mode::Refuse(_) => refused,
    }
}

/// [`dispatch_as`] for CUDA calls, which a child forked after CUDA was
/// initialised may not make (see [`FORKED`]).
pub fn dispatch(
    pass: impl FnOnce() -> CUresult,
    enforce: impl FnOnce(&'static Enforcer) -> CUresult,
) -> CUresult {
    if FORKED.load(Ordering::Relaxed) && matches!(mode(), Mode::Enforce(_)) {
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    dispatch_as(CUDA_ERROR_NOT_PERMITTED, pass, enforce)
}

/// Calls the interposer cannot bound: `CUDA_ERROR_NOT_SUPPORTED` when
/// limits apply, `pass` under a fail-open policy.
pub fn refused_when_limited(pass: impl FnOnce() -> CUresult) -> CUresult {
    dispatch(pass, |_| crate::ffi::CUDA_ERROR_NOT_SUPPORTED)
}

/// Declares exported CUDA hooks returning `CUresult`.
///
/// Each hook is `unsafe extern "C"`: its caller (C code) promises the
/// driver API contract of the function, in particular that pointer
/// arguments are valid as the API documents. The body is ordinary Rust:
/// every dereference of such a pointer is its own `unsafe` block stating
/// which part of that contract makes it sound. The symbol is exported
/// only from the built library, not from this crate's unit tests (which
/// would otherwise interpose on themselves).
macro_rules! hook {
    ($( $(#[$m:meta])* fn $name:ident ( $($arg:ident : $ty:ty),* $(,)? ) $body:block )*) => {
        $(
            $(#[$m])*
            #[cfg_attr(not(test), unsafe(no_mangle))]
            #[allow(non_snake_case, clippy::missing_safety_doc)]
            pub unsafe extern "C" fn $name($($arg: $ty),*) -> $crate::ffi::CUresult {
                $crate::hooks::guard($crate::ffi::CUDA_ERROR_UNKNOWN, move || $body)
            }
        )*
    };
}

/// Declares exported aliases forwarding to a hook with the same signature
/// (the hook catches panics).
macro_rules! alias {
    ($( $alias:ident => $target:ident ( $($arg:ident : $ty:ty),* $(,)? ); )*) => {
        $(
            #[cfg_attr(not(test), unsafe(no_mangle))]
            #[allow(non_snake_case, clippy::missing_safety_doc)]
            pub unsafe extern "C" fn $alias($($arg: $ty),*) -> $crate::ffi::CUresult {
                // SAFETY: same contract and arguments as the target.
                unsafe { $target($($arg),*) }
            }
        )*
    };
}

pub(crate) use {alias, hook};

macro_rules! table {
    ($($name:ident),* $(,)?) => {
        vec![$((stringify!($name), $name as *const () as usize)),*]
    };
}

/// Every hooked name and its address, sorted by name.
pub fn table() -> &'static [(&'static str, usize)] {
    static TABLE: crate::fork::Once<Vec<(&'static str, usize)>> = crate::fork::Once::new();
    TABLE.get_or_init(|| {
        let mut t = table![
            cuInit,
            cuGetProcAddress,
            cuGetProcAddress_v2,
            cuCtxCreate,
            cuCtxCreate_v2,
            cuCtxCreate_v3,
            cuCtxCreate_v4,
            cuCtxDestroy,
            cuCtxDestroy_v2,
            cuDevicePrimaryCtxRetain,
            cuDevicePrimaryCtxRelease,
            cuDevicePrimaryCtxRelease_v2,
            cuDevicePrimaryCtxReset,
            cuDevicePrimaryCtxReset_v2,
            cuMemAlloc_v2,
            cuMemAllocPitch_v2,
            cuMemAllocManaged,
            cuMemFree_v2,
            cuMemAllocAsync,
            cuMemAllocAsync_ptsz,
            cuMemAllocFromPoolAsync,
            cuMemAllocFromPoolAsync_ptsz,
            cuMemFreeAsync,
            cuMemFreeAsync_ptsz,
            cuMemPoolCreate,
            cuMemPoolTrimTo,
            cuGraphAddMemAllocNode,
            cuGraphAddNode,
            cuGraphAddNode_v2,
            cuGraphExecNodeSetParams,
            cuGraphExecChildGraphNodeSetParams,
            cuMemPoolDestroy,
            cuDeviceGetDefaultMemPool,
            cuDeviceGetMemPool,
            cuMemCreate,
            cuMemRelease,
            cuMemMap,
            cuMemRetainAllocationHandle,
            cuMemUnmap,
            cuArrayCreate_v2,
            cuArray3DCreate_v2,
            cuArrayDestroy,
            cuMipmappedArrayCreate,
            cuMipmappedArrayDestroy,
            cuMemGetInfo_v2,
            cuDeviceTotalMem_v2,
            cuLaunchKernel,
            cuLaunchKernel_ptsz,
            cuLaunchKernelEx,
            cuLaunchKernelEx_ptsz,
            cuLaunchCooperativeKernel,
            cuLaunchCooperativeKernel_ptsz,
            cuGraphInstantiate,
            cuGraphInstantiateWithFlags,
            cuGraphInstantiate_v2,
            cuGraphInstantiateWithParams,
            cuGraphExecKernelNodeSetParams_v2,
            cuGraphExecUpdate_v2,
            cuGraphInstantiateWithParams_ptsz,
            cuGraphExecKernelNodeSetParams,
            cuGraphExecUpdate,
            cuGraphExecDestroy,
            cuGraphLaunch,
            cuGraphLaunch_ptsz,
            cuMemAlloc,
            cuMemAllocPitch,
            cuMemGetInfo,
            cuArrayCreate,
            cuArray3DCreate,
            cuLaunch,
            cuLaunchGrid,
            cuLaunchGridAsync,
            nvmlInit,
            nvmlInit_v2,
            nvmlInitWithFlags,
            nvmlDeviceGetMemoryInfo,
            nvmlDeviceGetMemoryInfo_v2,
        ];
        t.sort_by(|a, b| a.0.cmp(b.0));
        t
    })
}

/// The hook for `name`, if there is one.
pub fn lookup(name: &[u8]) -> Option<usize> {
    let t = table();
    t.binary_search_by(|(n, _)| n.as_bytes().cmp(name))
        .ok()
        .map(|i| t[i].1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_sorted_and_unique() {
        let t = table();
        assert!(t.windows(2).all(|w| w[0].0 < w[1].0));
        assert_eq!(
            lookup(b"cuMemAlloc_v2"),
            Some(cuMemAlloc_v2 as *const () as usize)
        );
        assert_eq!(
            lookup(b"cuMemAlloc"),
            Some(cuMemAlloc as *const () as usize)
        );
        assert_eq!(lookup(b"cuDeviceGetCount"), None);
        assert_eq!(lookup(b"malloc"), None);
    }

    #[test]
    fn panics_become_error_codes() {
        assert_eq!(
            guard(CUDA_ERROR_UNKNOWN, || panic!("boom")),
            CUDA_ERROR_UNKNOWN
        );
    }
}
