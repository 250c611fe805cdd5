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
//! Lookups made by the real driver libraries (`libcuda`, `libnvidia-ml`)
//! for their own functions keep the real answer: the driver calling its
//! own entry points must not land in the hooks, which would count its work
//! twice. The driver is recognised by identity, not by name: the caller's
//! code must lie in the very object this library forwards to
//! ([`real::is_driver`]), and for a library handle the real answer must
//! lie in a driver object too. A helper library merely *named*
//! `libcuda.so.whatever` gets the hooks like any other code, and so does
//! a driver asking for another object's copy of a driver function; a
//! driver loaded under any file name is still recognised.
//!
//! Only x86_64 has the hook; elsewhere programs that `dlsym` driver
//! functions reach the real ones (linking and `cuGetProcAddress` still go
//! through the hooks).

use std::ffi::{CStr, c_char, c_void};

use crate::{real, sys};

/// Whether code address `caller` lies in a real driver library.
fn called_by_driver(caller: usize) -> bool {
    sys::object_at(caller).is_some_and(real::is_driver)
}

/// Whether address `addr` (a function) lies in a real driver library.
fn in_driver(addr: *mut c_void) -> bool {
    sys::object_at(addr as usize).is_some_and(real::is_driver)
}

/// Decides a `dlsym(handle, name)` call made from code address `caller`:
/// our hook's address, or 0 to let the real `dlsym` answer. Also makes
/// sure the real `dlsym` is known before the assembly jumps to it (and
/// answers for it when there is none; see [`dlsym_missing`]).
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
        let name = unsafe { CStr::from_ptr(name) };
        let bytes = name.to_bytes();
        if !(bytes.starts_with(b"cu") || bytes.starts_with(b"nvml")) {
            return std::ptr::null_mut();
        }
        let Some(hook) = crate::hooks::lookup(bytes) else {
            return std::ptr::null_mut();
        };
        // The pseudo-handles (RTLD_DEFAULT, RTLD_NEXT) resolve relative
        // to the caller, so only the real dlsym, jumped to, can answer
        // them for the driver; from anyone else the hook is the answer.
        let pseudo = handle.is_null() || handle as isize == -1;
        if called_by_driver(caller) {
            if pseudo {
                return std::ptr::null_mut();
            }
            let real = sys::real_dlsym(handle, name);
            return if real.is_null() || in_driver(real) {
                std::ptr::null_mut()
            } else {
                hook as *mut c_void
            };
        }
        // For a real library handle, answer only if the library has the
        // symbol, so probing for entry points keeps its meaning.
        if !pseudo && sys::real_dlsym(handle, name).is_null() {
            return std::ptr::null_mut();
        }
        hook as *mut c_void
    })
}

/// Answers a `dlsym` the real one should have answered when the C
/// library's `dlsym` could not be found (no known symbol version): NULL,
/// with a `dlerror` message naming the symbol, as a failed lookup has,
/// and one line on stderr. Jumped to by the hook with the caller's
/// arguments and return address.
pub extern "C" fn dlsym_missing(_handle: *mut c_void, name: *const c_char) -> *mut c_void {
    crate::hooks::guard(std::ptr::null_mut(), || {
        static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        if !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
            eprintln!("tessera: the C library's dlsym was not found; dlsym answers NULL");
        }
        if !name.is_null() {
            // SAFETY: dlsym's contract: name is a NUL-terminated string.
            sys::fail_lookup(unsafe { CStr::from_ptr(name) });
        }
        std::ptr::null_mut()
    })
}

#[cfg(target_arch = "x86_64")]
mod x86_64 {
    use std::ffi::{c_char, c_void};

    /// `dlsym`, hooked (see the module docs). Exported only from the
    /// built library: unit tests of this crate keep the C library's.
    ///
    /// # Safety
    /// The C library's `dlsym` contract.
    #[unsafe(naked)]
    #[cfg_attr(not(test), unsafe(no_mangle))]
    pub unsafe extern "C" fn dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void {
        // On entry rsp ≡ 8 (mod 16) and [rsp] is the caller's return
        // address, passed to the decision as its third argument (rdx is
        // free: dlsym has two). Two pushes and 8 bytes realign the stack
        // for the call; the arguments stay in rdi/rsi for the decision and
        // are restored for the jump, which keeps the caller's return
        // address on top of the stack for the real dlsym. The decision
        // looked for the real dlsym; if there is none, the jump goes to
        // the fallback instead of to address 0.
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
            "mov rax, qword ptr [rip + {real}]",
            "test rax, rax",
            "jz 3f",
            "jmp rax",
            "3:",
            "jmp {missing}",
            decide = sym super::dlsym_decide,
            real = sym crate::sys::TESSERA_REAL_DLSYM,
            missing = sym super::dlsym_missing,
        )
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn the_hook_answers_like_the_c_library_for_other_names() {
            // SAFETY: RTLD_DEFAULT and a NUL-terminated name.
            let p = unsafe { dlsym(std::ptr::null_mut(), c"getpid".as_ptr()) };
            assert_eq!(p as usize, libc::getpid as *const () as usize);
            // SAFETY: as above.
            let p = unsafe { dlsym(std::ptr::null_mut(), c"no_such_symbol_here".as_ptr()) };
            assert!(p.is_null());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_the_c_librarys_dlsym_lookups_fail_with_a_message() {
        // SAFETY: dlerror takes no arguments (clears a pending message).
        unsafe { libc::dlerror() };
        let p = dlsym_missing(std::ptr::null_mut(), c"cuMemAlloc_v2".as_ptr());
        assert!(p.is_null());
        // SAFETY: as above; the message is a NUL-terminated string.
        let msg = unsafe { libc::dlerror() };
        assert!(!msg.is_null(), "dlerror has the failure");
        // SAFETY: dlerror returned a NUL-terminated string, read at once.
        let msg = unsafe { CStr::from_ptr(msg) }
            .to_string_lossy()
            .into_owned();
        assert!(msg.contains("cuMemAlloc_v2"), "{msg}");
        assert!(dlsym_missing(std::ptr::null_mut(), std::ptr::null()).is_null());
    }
}
