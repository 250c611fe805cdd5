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
        let path = cstr(fname)?;
        if !std::path::Path::new(path).is_file() {
            return Err(CUDA_ERROR_FILE_NOT_FOUND);
        }
        out(m, hp(module::load(p)?))
    }

    fn cuModuleLoadData(m: *mut Handle, image: *const c_void) {
        let p = process::get()?;
        if image.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        out(m, hp(module::load(p)?))
    }

    fn cuModuleLoadDataEx(m: *mut Handle, image: *const c_void, n: c_uint, options: *mut c_int, values: *mut *mut c_void) {
        let _ = (n, options, values);
        let p = process::get()?;
        if image.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        out(m, hp(module::load(p)?))
    }

    fn cuModuleLoadFatBinary(m: *mut Handle, image: *const c_void) {
        let p = process::get()?;
        if image.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        out(m, hp(module::load(p)?))
    }

    fn cuModuleUnload(m: Handle) {
        let p = process::get()?;
        module::unload(p, h(m))
    }

    fn cuModuleGetFunction(f: *mut Handle, m: Handle, name: *const c_char) {
        let p = process::get()?;
        let name = cstr(name)?;
        out(f, hp(module::get_function(p, h(m), name)?))
    }

    fn cuModuleGetGlobal_v2(dptr: *mut CUdeviceptr, bytes: *mut usize, m: Handle, name: *const c_char) {
        let p = process::get()?;
        let (d, n) = module::global(p, h(m), cstr(name)?)?;
        super::ptr::out_opt(dptr, d);
        super::ptr::out_opt(bytes, n as usize);
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
        out(lib, hp(module::load_library(p)?))
    }

    fn cuLibraryUnload(lib: Handle) {
        let p = process::get()?;
        module::unload_library(p, h(lib))
    }

    fn cuLibraryGetKernel(kernel: *mut Handle, lib: Handle, name: *const c_char) {
        let p = process::get()?;
        out(kernel, hp(module::library_kernel(p, h(lib), cstr(name)?)?))
    }

    fn cuLibraryGetModule(m: *mut Handle, lib: Handle) {
        let p = process::get()?;
        out(m, hp(module::library_module(p, h(lib))?))
    }

    fn cuKernelGetFunction(f: *mut Handle, kernel: Handle) {
        let p = process::get()?;
        out(f, hp(module::kernel_function(p, h(kernel))?))
    }

    fn cuFuncGetAttribute(value: *mut c_int, attr: c_int, f: Handle) {
        let p = process::get()?;
        out(value, module::attribute(p, h(f), attr)?)
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
        out(name, module::name_ptr(p, h(f))?)
    }
}
