//! `cuGetExportTable` and the functions in the private tables it hands
//! out (what each slot does: [`crate::export_table`]).
//!
//! Slot functions are C functions like the entry points: each runs under
//! [`guard`] (or catches panics itself where the slot returns nothing)
//! and touches caller pointers only through [`super::ptr`].

use std::ffi::{c_int, c_uint, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};

use super::ptr::{out, out_opt, read};
use super::{cu_export, guard, h, hp};
use crate::abi::*;
use crate::export_table::{self as et, Id};
use crate::process;
use crate::status::*;

cu_export! {
    fn cuGetExportTable(table: *mut *const c_void, id: *const CUuuid) {
        // SAFETY: the caller's contract: `id` is NULL or points to a
        // readable CUuuid; `read` rejects NULL.
        let id = unsafe { read(id) }?.bytes;
        if super::trace_enabled() {
            eprintln!("gpusim-trace: cuGetExportTable({})", et::uuid_text(&id));
        }
        match et::find(&id) {
            Some(known) => {
                let t = tables()[known.id as usize].as_ptr().cast::<c_void>();
                // SAFETY: the caller's contract: `table` is NULL or points
                // to a writable pointer; `out` rejects NULL.
                unsafe { out(table, t) }
            }
            None => {
                if !et::refused_quietly(&id) {
                    et::log_once(format!(
                        "cuGetExportTable: unknown table {} refused",
                        et::uuid_text(&id)
                    ));
                }
                // SAFETY: the caller's contract: `table` is NULL or points
                // to a writable pointer; `out_opt` skips NULL.
                unsafe { out_opt(table, std::ptr::null()) };
                Err(CUDA_ERROR_NOT_FOUND)
            }
        }
    }
}

/// The tables, built on first use.
fn tables() -> &'static [Vec<usize>] {
    et::tables(|t, i| known_slot(t, i).unwrap_or_else(|| stub(t, i)))
}

macro_rules! f {
    ($name:path) => {
        $name as *const () as usize
    };
}

/// The simulated function of slot `i` of table `t`, if any.
fn known_slot(t: Id, i: usize) -> Option<usize> {
    Some(match (t, i) {
        (Id::CudartInterface, 1) => f!(module_from_fatbin),
        (Id::CudartInterface, 2) => f!(primary_context),
        (Id::CudartInterface, 6) => f!(module_from_fatbin_ext),
        (Id::CudartInterface, 7) => f!(cudart_notice),
        (Id::CudartInterface, 8) => f!(module_from_fatbin_header),
        (Id::CudartInterface, 12) => f!(load_compilers),
        (Id::ToolsRuntimeCallbackHooks, 2) => f!(hooks_buffer_large),
        (Id::ToolsRuntimeCallbackHooks, 6) => f!(hooks_buffer_small),
        (Id::ContextLocalStorage, 0) => f!(storage_put),
        (Id::ContextLocalStorage, 1) => f!(storage_delete),
        (Id::ContextLocalStorage, 2) => f!(storage_get),
        (Id::CtxCreateBypass, 1) => f!(ctx_create_bypass),
        (Id::IntegrityCheck, 1) => f!(integrity_check),
        (Id::ContextChecks, 2) => f!(context_check),
        (Id::ContextChecks, 3) => f!(context_check_flags),
        _ => return None,
    })
}

/// A function for a slot nothing simulates: it names the table and slot
/// once on stderr and returns `CUDA_ERROR_NOT_SUPPORTED`.
unsafe extern "C" fn unknown<const T: usize, const S: usize>() -> CUresult {
    guard(|| {
        et::unknown_slot(T, S);
        Err(CUDA_ERROR_NOT_SUPPORTED)
    })
}

macro_rules! stubs_of {
    ($t:expr; $($s:literal)*) => {
        [$(unknown::<{ $t }, $s> as *const () as usize),*]
    };
}

fn stubs<const T: usize>() -> [usize; et::MAX_SLOTS] {
    stubs_of!(T; 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31)
}

fn stub(t: Id, i: usize) -> usize {
    let all = match t {
        Id::CudartInterface => stubs::<0>(),
        Id::ToolsTls => stubs::<1>(),
        Id::ToolsRuntimeCallbackHooks => stubs::<2>(),
        Id::ContextLocalStorage => stubs::<3>(),
        Id::CtxCreateBypass => stubs::<4>(),
        Id::HeapAccess => stubs::<5>(),
        Id::DeviceExtendedRt => stubs::<6>(),
        Id::IntegrityCheck => stubs::<7>(),
        Id::ContextChecks => stubs::<8>(),
    };
    all[i]
}

/// Loads a fat binary (its `__fatBinC_Wrapper_t`) as a module.
unsafe extern "C" fn module_from_fatbin(module: *mut Handle, wrapper: *const c_void) -> CUresult {
    super::traced("module_from_fatbin", || {
        let p = process::get()?;
        let m = crate::module::load_image(p, wrapper.cast())?;
        // SAFETY: the runtime's contract: `module` is NULL or points to a
        // writable CUmodule; `out` rejects NULL.
        unsafe { out(module, hp(m)) }
    })
}

/// [`module_from_fatbin`] with three more arguments (unused here).
unsafe extern "C" fn module_from_fatbin_ext(
    module: *mut Handle,
    wrapper: *const c_void,
    _a: *mut c_void,
    _b: *mut c_void,
    _c: c_uint,
) -> CUresult {
    // SAFETY: the same contract as `module_from_fatbin` for the two
    // arguments it reads.
    unsafe { module_from_fatbin(module, wrapper) }
}

/// Loads a fat binary given by its header (not its wrapper) as a module.
unsafe extern "C" fn module_from_fatbin_header(
    header: *const c_void,
    module: *mut Handle,
    _a: *mut c_void,
    _b: *mut c_void,
    _c: c_uint,
) -> CUresult {
    super::traced("module_from_fatbin_header", || {
        let p = process::get()?;
        let m = crate::module::load_image(p, header.cast())?;
        // SAFETY: the runtime's contract: `module` is NULL or points to a
        // writable CUmodule; `out` rejects NULL.
        unsafe { out(module, hp(m)) }
    })
}

/// The primary context of `dev`, active or not, without taking a
/// reference (the runtime retains it through the driver API when it uses
/// it; counting devices costs no context).
unsafe extern "C" fn primary_context(ctx: *mut Handle, dev: CUdevice) -> CUresult {
    super::traced("primary_context", || {
        let p = process::get()?;
        let c = crate::context::primary_handle_of(p, dev)?;
        // SAFETY: the runtime's contract: `ctx` is NULL or points to a
        // writable CUcontext; `out` rejects NULL.
        unsafe { out(ctx, hp(c)) }
    })
}

/// A notice from the runtime with one argument; nothing to do.
unsafe extern "C" fn cudart_notice(arg: usize) {
    if super::trace_enabled() {
        eprintln!("gpusim-trace: cudart_notice({arg:#x})");
    }
}

/// Loading the JIT compilers: nothing to load here.
unsafe extern "C" fn load_compilers() -> CUresult {
    CUDA_SUCCESS
}

/// A zeroed buffer of `words` words that lives as long as the process.
fn buffer(cell: &'static std::sync::OnceLock<usize>, words: usize) -> usize {
    *cell.get_or_init(|| Box::leak(vec![0u64; words].into_boxed_slice()).as_mut_ptr() as usize)
}

/// Writes `buf` and `len` through the caller's two out-pointers.
fn hand_out(ptr: *mut *mut c_void, size: *mut usize, buf: usize, len: usize) {
    if super::trace_enabled() {
        eprintln!("gpusim-trace: tools buffer of {len} bytes");
    }
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: the runtime's contract: `ptr` and `size` are NULL or
        // point to a writable pointer and size_t; `out_opt` skips NULL.
        unsafe {
            out_opt(ptr, buf as *mut c_void);
            out_opt(size, len);
        }
    }));
}

/// The runtime's tools buffer (1024 bytes, the size public
/// reimplementations report, with room to spare behind it).
unsafe extern "C" fn hooks_buffer_large(ptr: *mut *mut c_void, size: *mut usize) {
    static BUF: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    hand_out(ptr, size, buffer(&BUF, 1024), 1024);
}

/// The runtime's second, small tools buffer (14 bytes, with room to
/// spare).
unsafe extern "C" fn hooks_buffer_small(ptr: *mut *mut c_void, size: *mut usize) {
    static BUF: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    hand_out(ptr, size, buffer(&BUF, 64), 14);
}

/// The context a storage call names: `ctx`, or the current one for NULL.
fn storage_context(ctx: Handle) -> Result<u64, CUresult> {
    let c = h(ctx);
    if c != 0 {
        return Ok(c);
    }
    process::current_context().ok_or(CUDA_ERROR_INVALID_CONTEXT)
}

unsafe extern "C" fn storage_put(
    ctx: Handle,
    key: *mut c_void,
    value: *mut c_void,
    dtor: *const c_void,
) -> CUresult {
    super::traced("storage_put", || {
        let c = storage_context(ctx)?;
        et::local_storage().put(c, key as usize, value as usize, dtor as usize);
        Ok(())
    })
}

unsafe extern "C" fn storage_delete(ctx: Handle, key: *mut c_void) -> CUresult {
    super::traced("storage_delete", || {
        let c = storage_context(ctx)?;
        et::local_storage().delete(c, key as usize);
        Ok(())
    })
}

unsafe extern "C" fn storage_get(
    value: *mut *mut c_void,
    ctx: Handle,
    key: *mut c_void,
) -> CUresult {
    super::traced("storage_get", || {
        let c = storage_context(ctx)?;
        let v = et::local_storage()
            .get(c, key as usize)
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        // SAFETY: the runtime's contract: `value` is NULL or points to a
        // writable pointer; `out` rejects NULL.
        unsafe { out(value, v as *mut c_void) }
    })
}

/// `cuCtxCreate_v2` by another way in.
unsafe extern "C" fn ctx_create_bypass(ctx: *mut Handle, flags: c_uint, dev: CUdevice) -> CUresult {
    super::traced("ctx_create_bypass", || {
        let p = process::get()?;
        let c = crate::context::create(p, dev, flags)?;
        // SAFETY: the runtime's contract: `ctx` is NULL or points to a
        // writable CUcontext; `out` rejects NULL.
        unsafe { out(ctx, hp(c)) }
    })
}

/// The runtime's integrity check (see [`crate::export_table`]).
unsafe extern "C" fn integrity_check(
    version: c_uint,
    unix_seconds: u64,
    result: *mut [u64; 2],
) -> CUresult {
    super::traced("integrity_check", || {
        let p = process::get()?;
        let all = tables();
        let integrity = &all[Id::IntegrityCheck as usize];
        let input = et::IntegrityInput {
            driver_version: p.sim.node().cuda_version as u32,
            runtime_version: version,
            pid: std::process::id(),
            thread: crate::sys::thread_id_word(),
            cudart_table: all[Id::CudartInterface as usize].as_ptr() as usize,
            integrity_table: integrity.as_ptr() as usize,
            check_fn: integrity[1],
            unix_seconds,
        };
        let devices = (0..p.sim.gpu_count())
            .map(|d| {
                let attr = |a| crate::device::attribute(p, d as c_int, a).unwrap_or(0);
                et::IntegrityDevice {
                    uuid: p.sim.uuid_bytes(d),
                    pci_domain: attr(crate::abi::attr::PCI_DOMAIN_ID),
                    pci_bus: attr(crate::abi::attr::PCI_BUS_ID),
                    pci_device: attr(crate::abi::attr::PCI_DEVICE_ID),
                }
            })
            .collect::<Vec<_>>();
        // SAFETY: the runtime's contract: `result` is NULL or points to two
        // writable words; `out` rejects NULL.
        unsafe { out(result, et::integrity(&input, &devices)) }
    })
}

/// A check on a context: nothing to report.
unsafe extern "C" fn context_check(
    _ctx: Handle,
    result: *mut u32,
    _detail: *mut *const c_void,
) -> CUresult {
    super::traced("context_check", || {
        // SAFETY: the runtime's contract: `result` is NULL or points to a
        // writable u32; `out` rejects NULL.
        unsafe { out(result, 0u32) }
    })
}

/// Flags the runtime checks: none set.
unsafe extern "C" fn context_check_flags() -> u32 {
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table_of(id: &str) -> Result<*const usize, CUresult> {
        let known = et::TABLES
            .iter()
            .find(|t| et::uuid_text(&t.uuid) == id)
            .map(|t| t.uuid)
            .unwrap_or([0xee; 16]);
        let mut t: *const c_void = std::ptr::null();
        // SAFETY: both pointers are valid for the call.
        let code = unsafe { cuGetExportTable(&mut t, &CUuuid { bytes: known }) };
        if code == CUDA_SUCCESS {
            Ok(t.cast())
        } else {
            Err(code)
        }
    }

    #[test]
    fn tables_have_their_size_and_unknown_slots_say_so() {
        let t = table_of("6bd5fb6c-5bf4-e74a-8987-d93912fd9df9").unwrap();
        // SAFETY: the cudart interface table has 13 words.
        let (size, slot3) = unsafe { (*t, *t.add(3)) };
        assert_eq!(size, 13 * 8);
        // SAFETY: every slot without a simulated function is `unknown`,
        // which takes no arguments.
        let f: unsafe extern "C" fn() -> CUresult = unsafe { std::mem::transmute(slot3) };
        // SAFETY: as above.
        assert_eq!(unsafe { f() }, CUDA_ERROR_NOT_SUPPORTED);
        assert_eq!(table_of("unknown"), Err(CUDA_ERROR_NOT_FOUND));
    }
}
