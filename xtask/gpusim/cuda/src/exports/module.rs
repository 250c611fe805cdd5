//! Modules, libraries and functions.

use std::ffi::{c_char, c_int, c_uint, c_void};

use super::ptr::{cstr, out};
use super::{cu_export, h, hp};
use crate::abi::*;
use crate::module;
use crate::process;
use crate::status::*;

cu_export! {
    fn cuModuleLoad(m: *mut Handle, fname: *const c_char) {
        let p = process::get()?;
        // SAFETY: the caller's contract: `fname` is NULL or a NUL-terminated
        // string that outlives the call; `cstr` rejects NULL.
        let path = unsafe { cstr(fname) }?;
        if !std::path::Path::new(path).is_file() {
            return Err(CUDA_ERROR_FILE_NOT_FOUND);
        }
        let v = hp(module::load(p)?);
        // SAFETY: the caller's contract: `m` is NULL or points to a writable
        // `Handle`; `out` rejects NULL.
        unsafe { out(m, v) }
    }

    fn cuModuleLoadData(m: *mut Handle, image: *const c_void) {
        let p = process::get()?;
        if image.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let v = hp(module::load(p)?);
        // SAFETY: the caller's contract: `m` is NULL or points to a writable
        // `Handle`; `out` rejects NULL.
        unsafe { out(m, v) }
    }

    fn cuModuleLoadDataEx(m: *mut Handle, image: *const c_void, n: c_uint, options: *mut c_int, values: *mut *mut c_void) {
        let _ = (n, options, values);
        let p = process::get()?;
        if image.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let v = hp(module::load(p)?);
        // SAFETY: the caller's contract: `m` is NULL or points to a writable
        // `Handle`; `out` rejects NULL.
        unsafe { out(m, v) }
    }

    fn cuModuleLoadFatBinary(m: *mut Handle, image: *const c_void) {
        let p = process::get()?;
        if image.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let v = hp(module::load(p)?);
        // SAFETY: the caller's contract: `m` is NULL or points to a writable
        // `Handle`; `out` rejects NULL.
        unsafe { out(m, v) }
    }

    /// `CU_MODULE_EAGER_LOADING` (1) when `CUDA_MODULE_LOADING=EAGER`, else
    /// `CU_MODULE_LAZY_LOADING` (2), the driver's default since CUDA 12.2.
    fn cuModuleGetLoadingMode(mode: *mut c_int) {
        let eager = std::env::var("CUDA_MODULE_LOADING").is_ok_and(|v| v == "EAGER");
        // SAFETY: the caller's contract: `mode` is NULL or points to a
        // writable CUmoduleLoadingMode (an int); `out` rejects NULL.
        unsafe { out(mode, if eager { 1 } else { 2 }) }
    }

    fn cuModuleUnload(m: Handle) {
        let p = process::get()?;
        module::unload(p, h(m))
    }

    fn cuModuleGetFunction(f: *mut Handle, m: Handle, name: *const c_char) {
        let p = process::get()?;
        // SAFETY: the caller's contract: `name` is NULL or a NUL-terminated
        // string that outlives the call; `cstr` rejects NULL.
        let name = unsafe { cstr(name) }?;
        let v = hp(module::get_function(p, h(m), name)?);
        // SAFETY: the caller's contract: `f` is NULL or points to a writable
        // `Handle`; `out` rejects NULL.
        unsafe { out(f, v) }
    }

    fn cuModuleGetGlobal_v2(dptr: *mut CUdeviceptr, bytes: *mut usize, m: Handle, name: *const c_char) {
        let p = process::get()?;
        // SAFETY: the caller's contract: `name` is NULL or a NUL-terminated
        // string that outlives the call; `cstr` rejects NULL.
        let (d, n) = module::global(p, h(m), unsafe { cstr(name) }?)?;
        // SAFETY: the caller's contract: `dptr` is NULL or points to a
        // writable `CUdeviceptr`; `out_opt` skips NULL.
        unsafe { super::ptr::out_opt(dptr, d) };
        // SAFETY: the caller's contract: `bytes` is NULL or points to a
        // writable `usize`; `out_opt` skips NULL.
        unsafe { super::ptr::out_opt(bytes, n as usize) };
        Ok(())
    }

    fn cuLibraryLoadData(
        lib: *mut Handle,
        code: *const c_void,
        jit_options: *mut c_int,
        jit_values: *mut *mut c_void,
        n_jit: c_uint,
        lib_options: *mut c_int,
        lib_values: *mut *mut c_void,
        n_lib: c_uint,
    ) {
        let _ = (jit_options, jit_values, n_jit, lib_options, lib_values, n_lib);
        let p = process::get()?;
        if code.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let v = hp(module::load_library(p)?);
        // SAFETY: the caller's contract: `lib` is NULL or points to a writable
        // `Handle`; `out` rejects NULL.
        unsafe { out(lib, v) }
    }

    fn cuLibraryUnload(lib: Handle) {
        let p = process::get()?;
        module::unload_library(p, h(lib))
    }

    fn cuLibraryGetKernel(kernel: *mut Handle, lib: Handle, name: *const c_char) {
        let p = process::get()?;
        // SAFETY: the caller's contract: `name` is NULL or a NUL-terminated
        // string that outlives the call; `cstr` rejects NULL.
        let name = unsafe { cstr(name) }?;
        let k = module::library_kernel(p, h(lib), name)?;
        // SAFETY: the caller's contract: `kernel` is NULL or points to a
        // writable `Handle`; `out` rejects NULL.
        unsafe { out(kernel, hp(k)) }
    }

    fn cuLibraryGetModule(m: *mut Handle, lib: Handle) {
        let p = process::get()?;
        let v = hp(module::library_module(p, h(lib))?);
        // SAFETY: the caller's contract: `m` is NULL or points to a writable
        // `Handle`; `out` rejects NULL.
        unsafe { out(m, v) }
    }

    fn cuKernelGetFunction(f: *mut Handle, kernel: Handle) {
        let p = process::get()?;
        let v = hp(module::kernel_function(p, h(kernel))?);
        // SAFETY: the caller's contract: `f` is NULL or points to a writable
        // `Handle`; `out` rejects NULL.
        unsafe { out(f, v) }
    }

    fn cuFuncGetAttribute(value: *mut c_int, attr: c_int, f: Handle) {
        let p = process::get()?;
        let v = module::attribute(p, h(f), attr)?;
        // SAFETY: the caller's contract: `value` is NULL or points to a
        // writable `c_int`; `out` rejects NULL.
        unsafe { out(value, v) }
    }

    fn cuFuncSetAttribute(f: Handle, attr: c_int, value: c_int) {
        let p = process::get()?;
        module::set_attribute(p, h(f), attr, value)
    }

    fn cuFuncSetCacheConfig(f: Handle, config: c_int) {
        let p = process::get()?;
        module::attribute(p, h(f), 0)?;
        if (0..=3).contains(&config) { Ok(()) } else { Err(CUDA_ERROR_INVALID_VALUE) }
    }

    fn cuFuncGetName(name: *mut *const c_char, f: Handle) {
        let p = process::get()?;
        let v = module::name_ptr(p, h(f))?;
        // SAFETY: the caller's contract: `name` is NULL or points to a writable
        // `*const c_char`; `out` rejects NULL.
        unsafe { out(name, v) }
    }

    fn cuKernelGetAttribute(value: *mut c_int, attr: c_int, kernel: Handle, dev: CUdevice) {
        let p = process::get()?;
        p.device(dev)?;
        let v = module::attribute(p, h(kernel), attr)?;
        // SAFETY: the caller's contract: `value` is NULL or points to a
        // writable `c_int`; `out` rejects NULL.
        unsafe { out(value, v) }
    }

    fn cuKernelSetAttribute(attr: c_int, value: c_int, kernel: Handle, dev: CUdevice) {
        let p = process::get()?;
        p.device(dev)?;
        module::set_attribute(p, h(kernel), attr, value)
    }

    fn cuKernelSetCacheConfig(kernel: Handle, config: c_int, dev: CUdevice) {
        let p = process::get()?;
        p.device(dev)?;
        module::attribute(p, h(kernel), 0)?;
        if (0..=3).contains(&config) { Ok(()) } else { Err(CUDA_ERROR_INVALID_VALUE) }
    }

    fn cuKernelGetName(name: *mut *const c_char, kernel: Handle) {
        let p = process::get()?;
        let v = module::name_ptr(p, h(kernel))?;
        // SAFETY: the caller's contract: `name` is NULL or points to a writable
        // `*const c_char`; `out` rejects NULL.
        unsafe { out(name, v) }
    }
}
