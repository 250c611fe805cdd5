//! Modules, libraries and kernel functions.
//!
//! No code is ever loaded or run: any image loads, and any name yields a
//! function whose duration comes from the cost model (with the node's
//! per-function overrides, looked up by this name).

use std::collections::HashMap;
use std::ffi::CString;

use gpusim::cost::{KernelCost, LaunchShape};

use crate::process::{Function, Inner, KernelObj, Library, Module, Process};
use crate::status::*;

/// `cuModuleLoad*`: a new, empty module.
pub fn load(p: &Process) -> Result<u64, CUresult> {
    let mut inner = p.lock();
    inner.current()?;
    Ok(inner.modules.insert(Module {
        functions: HashMap::new(),
    }))
}

/// `cuModuleLoadData` and the runtime's fat-binary loads: `image` (a
/// cubin, PTX text, a fat binary or its wrapper) stays opaque.
pub fn load_image(p: &Process, image: *const u8) -> Result<u64, CUresult> {
    if image.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    load(p)
}

/// `cuModuleUnload`.
pub fn unload(p: &Process, h: u64) -> Result<(), CUresult> {
    let mut inner = p.lock();
    let m = inner.modules.remove(h)?;
    for f in m.functions.into_values() {
        let _ = inner.functions.remove(f);
    }
    Ok(())
}

fn function_in(inner: &mut Inner, module: u64, name: &str) -> Result<u64, CUresult> {
    if name.is_empty() {
        return Err(CUDA_ERROR_NOT_FOUND);
    }
    if let Some(&f) = inner.modules.get(module)?.functions.get(name) {
        return Ok(f);
    }
    let gpus = inner.primary.len();
    let f = inner.functions.insert(Function {
        name: CString::new(name).map_err(|_| CUDA_ERROR_INVALID_VALUE)?,
        costs: vec![None; gpus],
        max_dynamic_shared: 48 * 1024,
        block_shape: [1, 1, 1],
    });
    inner
        .modules
        .get_mut(module)?
        .functions
        .insert(name.to_string(), f);
    Ok(f)
}

/// `cuModuleGetFunction`.
pub fn get_function(p: &Process, module: u64, name: &str) -> Result<u64, CUresult> {
    function_in(&mut p.lock(), module, name)
}

/// `cuLibraryLoadData`.
pub fn load_library(p: &Process) -> Result<u64, CUresult> {
    let mut inner = p.lock();
    let module = inner.modules.insert(Module {
        functions: HashMap::new(),
    });
    Ok(inner.libraries.insert(Library {
        module,
        kernels: HashMap::new(),
    }))
}

/// `cuLibraryUnload`.
pub fn unload_library(p: &Process, h: u64) -> Result<(), CUresult> {
    let module = {
        let mut inner = p.lock();
        let lib = inner.libraries.remove(h)?;
        for k in lib.kernels.into_values() {
            let _ = inner.kernels.remove(k);
        }
        lib.module
    };
    unload(p, module)
}

/// `cuLibraryGetKernel`.
pub fn library_kernel(p: &Process, lib: u64, name: &str) -> Result<u64, CUresult> {
    let mut inner = p.lock();
    let l = inner.libraries.get(lib)?;
    if let Some(&k) = l.kernels.get(name) {
        return Ok(k);
    }
    let module = l.module;
    let function = function_in(&mut inner, module, name)?;
    let k = inner.kernels.insert(KernelObj { function });
    inner
        .libraries
        .get_mut(lib)?
        .kernels
        .insert(name.to_string(), k);
    Ok(k)
}

/// `cuLibraryGetModule`.
pub fn library_module(p: &Process, lib: u64) -> Result<u64, CUresult> {
    Ok(p.lock().libraries.get(lib)?.module)
}

/// `cuKernelGetFunction`.
pub fn kernel_function(p: &Process, kernel: u64) -> Result<u64, CUresult> {
    Ok(p.lock().kernels.get(kernel)?.function)
}

/// Accepts a `CUfunction` or a `CUkernel` (launch APIs take both).
pub fn resolve(inner: &Inner, f: u64) -> Result<u64, CUresult> {
    if inner.functions.contains(f) {
        Ok(f)
    } else {
        Ok(inner.kernels.get(f)?.function)
    }
}

/// Duration of launching function `f` (already [`resolve`]d) with
/// `shape` on `device`, caching the function's cost there.
pub fn duration(
    p: &Process,
    inner: &mut Inner,
    f: u64,
    device: usize,
    shape: &LaunchShape,
) -> Result<u64, CUresult> {
    let func = inner.functions.get_mut(f)?;
    let cost = match func.costs.get(device).copied().flatten() {
        Some(c) => c,
        None => {
            let node = p.sim.node();
            let c = KernelCost::new(node, &node.gpu[device], func.name.to_str().unwrap_or(""));
            if let Some(slot) = func.costs.get_mut(device) {
                *slot = Some(c);
            }
            c
        }
    };
    Ok(cost.duration_ns(shape))
}

/// `cuFuncGetAttribute`.
pub fn attribute(p: &Process, f: u64, attr: i32) -> Result<i32, CUresult> {
    let inner = p.lock();
    let f = resolve(&inner, f)?;
    let func = inner.functions.get(f)?;
    Ok(match attr {
        0 => 1024,                    // MAX_THREADS_PER_BLOCK
        1 => 0,                       // SHARED_SIZE_BYTES
        2 => 0,                       // CONST_SIZE_BYTES
        3 => 0,                       // LOCAL_SIZE_BYTES
        4 => 32,                      // NUM_REGS
        5 | 6 => 90,                  // PTX_VERSION, BINARY_VERSION
        7 => 0,                       // CACHE_MODE_CA
        8 => func.max_dynamic_shared, // MAX_DYNAMIC_SHARED_SIZE_BYTES
        9 => -1,                      // PREFERRED_SHARED_MEMORY_CARVEOUT
        10..=15 => 0,                 // cluster attributes
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    })
}

/// `cuFuncSetAttribute`.
pub fn set_attribute(p: &Process, f: u64, attr: i32, value: i32) -> Result<(), CUresult> {
    let mut inner = p.lock();
    let f = resolve(&inner, f)?;
    let func = inner.functions.get_mut(f)?;
    match attr {
        8 if (0..=227 * 1024).contains(&value) => {
            func.max_dynamic_shared = value;
            Ok(())
        }
        9 if (-1..=100).contains(&value) => Ok(()),
        10..=15 => Ok(()),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

/// The name of function `f` (NUL-terminated, owned by the function).
pub fn name_ptr(p: &Process, f: u64) -> Result<*const std::ffi::c_char, CUresult> {
    let inner = p.lock();
    let f = resolve(&inner, f)?;
    Ok(inner.functions.get(f)?.name.as_ptr())
}

/// `cuModuleGetGlobal_v2`: a 256-byte device variable per (module, name).
pub fn global(p: &Process, module: u64, name: &str) -> Result<(u64, u64), CUresult> {
    let mut inner = p.lock();
    inner.modules.get(module)?;
    if name.is_empty() {
        return Err(CUDA_ERROR_NOT_FOUND);
    }
    let addr = inner.va.alloc(256, 256).ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
    Ok((addr, 256))
}
