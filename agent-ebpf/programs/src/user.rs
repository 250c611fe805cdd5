//! Reading the traced process's memory (ioctl arguments and the
//! parameter blocks they point at).

use aya_ebpf::helpers::bpf_probe_read_user;

/// Reads a `T` from user memory at `addr`; `None` if it is unreadable.
#[inline(always)]
pub fn read_user<T>(addr: u64) -> Option<T> {
    // SAFETY: bpf_probe_read_user is fault-tolerant: any address is
    // allowed and an unreadable one returns an error.
    unsafe { bpf_probe_read_user(addr as *const T) }.ok()
}
