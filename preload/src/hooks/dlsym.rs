//! The `dlsym` hook.
//!
//! Programs that `dlopen` the driver and look functions up by name (with
//! `dlsym`) would bypass interposition; this hook hands out our function
//! for every hooked name. Everything else must behave exactly like the C
//! library's `dlsym`, including `RTLD_NEXT`, which resolves relative to
//! the *caller*: glibc finds the caller from the return address. So the
//! hook is a naked function that asks [`dlsym_decide`] and, when it has
//! nothing to say, *jumps* (not calls) to the real `dlsym` with the
//! original arguments and the original return address on the stack.
//!
//! Lookups made by the driver libraries themselves (`libcuda`,
//! `libnvidia-ml`) keep the real answer: the driver calling its own entry
//! points must not land in the hooks, which would count its work twice.
//!
//! Only x86_64 has the hook; elsewhere programs that `dlsym` driver
//! functions reach the real ones (linking and `cuGetProcAddress` still go
//! through the hooks).

use std::ffi::{CStr, c_char, c_void};

use crate::sys;

/// Shared objects whose own lookups are never redirected.
const DRIVER_OBJECTS: &[&[u8]] = &[b"libcuda.so", b"libnvidia-ml.so"];

/// Decides a `dlsym(handle, name)` call made from code address `caller`:
/// our hook's address, or 0 to let the real `dlsym` answer. Also makes
/// sure the real `dlsym` is known before the assembly jumps to it.
pub extern "C" fn dlsym_decide(
    handle: *mut c_void,
    name: *const c_char,
    caller: usize,
) -> *mut c_void {
    crate::hooks::guard(std::ptr::null_mut(), || {
        sys::init_real_dlsym();
        if name.is_null() {
            return std::ptr::null_mut();
        }
        // SAFETY: dlsym's contract: name is a NUL-terminated string.
        let bytes = unsafe { CStr::from_ptr(name) }.to_bytes();
        if !(bytes.starts_with(b"cu") || bytes.starts_with(b"nvml")) {
            return std::ptr::null_mut();
        }
        let Some(hook) = crate::hooks::lookup(bytes) else {
            return std::ptr::null_mut();
        };
        if sys::code_in_object(caller, DRIVER_OBJECTS) {
            return std::ptr::null_mut();
        }
        // For a real library handle, answer only if the library has the
        // symbol, so probing for entry points keeps its meaning. The
        // pseudo-handles (RTLD_DEFAULT, RTLD_NEXT) would resolve relative
        // to this library here; for them the hook is the answer anyway.
        let pseudo = handle.is_null() || handle as isize == -1;
        if !pseudo {
            // SAFETY: as above.
            let real = sys::real_dlsym(handle, unsafe { CStr::from_ptr(name) });
            if real.is_null() {
                return std::ptr::null_mut();
            }
        }
        hook as *mut c_void
    })
}

#[cfg(target_arch = "x86_64")]
mod x86_64 {
    use std::ffi::{c_char, c_void};

    /// `dlsym`, hooked (see the module docs).
    ///
    /// # Safety
    /// The C library's `dlsym` contract.
    #[unsafe(naked)]
    #[unsafe(no_mangle)]
    pub unsafe extern "C" fn dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void {
        // On entry rsp ≡ 8 (mod 16) and [rsp] is the caller's return
        // address, passed to the decision as its third argument (rdx is
        // free: dlsym has two). Two pushes and 8 bytes realign the stack
        // for the call; the arguments stay in rdi/rsi for the decision and
        // are restored for the jump, which keeps the caller's return
        // address on top of the stack for the real dlsym.
        core::arch::naked_asm!(
            "mov rdx, [rsp]",
            "push rdi",
            "push rsi",
            "sub rsp, 8",
            "call {decide}",
            "add rsp, 8",
            "pop rsi",
            "pop rdi",
            "test rax, rax",
            "jz 2f",
            "ret",
            "2:",
            "jmp qword ptr [rip + {real}]",
            decide = sym super::dlsym_decide,
            real = sym crate::sys::TESSERA_REAL_DLSYM,
        )
    }
}
