//! The few `bpf(2)` commands the agent needs and aya 0.14 does not expose.
//!
//! aya attaches cgroup programs through bpf links but keeps a cgroup
//! device link inside its program object, with no way to pin it (there is
//! no `FdLink` conversion for `CgroupDeviceLink` in 0.14). A guard must
//! outlive the agent, so the agent creates the link itself
//! ([`cgroup_link_create`]), pins it ([`obj_pin`]), and later reopens it
//! ([`obj_get`]) and asks the kernel what it is attached to
//! ([`link_info`]). Everything else stays with aya.
//!
//! This is the agent's only unsafe code for eBPF outside aya (NVML's is in
//! `tessera-nvml-sys`): each function fills a
//! zeroed `bpf_attr` prefix and makes one system call through the
//! `unsafe` `bpf` wrapper, whose contract (the pointers inside the
//! attribute block) each caller states.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// `BPF_OBJ_PIN`.
const BPF_OBJ_PIN: libc::c_int = 6;
/// `BPF_OBJ_GET`.
const BPF_OBJ_GET: libc::c_int = 7;
/// `BPF_OBJ_GET_INFO_BY_FD`.
const BPF_OBJ_GET_INFO_BY_FD: libc::c_int = 15;
/// `BPF_LINK_CREATE`.
const BPF_LINK_CREATE: libc::c_int = 28;

/// `BPF_CGROUP_DEVICE`, the attach type of device programs.
pub const BPF_CGROUP_DEVICE: u32 = 6;
/// `BPF_LINK_TYPE_CGROUP`.
pub const BPF_LINK_TYPE_CGROUP: u32 = 3;

/// The `link_create` member of `union bpf_attr` (the part used).
#[repr(C)]
#[derive(Default)]
struct LinkCreateAttr {
    prog_fd: u32,
    target_fd: u32,
    attach_type: u32,
    flags: u32,
    /// The rest of the member (unused, zero).
    rest: [u64; 4],
}

/// The `BPF_OBJ_*` member of `union bpf_attr`.
#[repr(C)]
#[derive(Default)]
struct ObjAttr {
    pathname: u64,
    bpf_fd: u32,
    file_flags: u32,
    path_fd: i32,
    pad: u32,
}

/// The `info` member of `union bpf_attr`.
#[repr(C)]
#[derive(Default)]
struct InfoAttr {
    bpf_fd: u32,
    info_len: u32,
    info: u64,
}

/// The head of `struct bpf_link_info` with its `cgroup` union member.
#[repr(C)]
#[derive(Default)]
struct RawLinkInfo {
    link_type: u32,
    id: u32,
    prog_id: u32,
    pad: u32,
    cgroup_id: u64,
    attach_type: u32,
    pad2: u32,
}

/// What the kernel says about a bpf link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinkInfo {
    /// `BPF_LINK_TYPE_*`.
    pub link_type: u32,
    /// Link id.
    pub id: u32,
    /// Id of the program it runs.
    pub prog_id: u32,
    /// For a cgroup link: the cgroup's id, 0 once the cgroup is gone (the
    /// kernel detaches links of a removed cgroup).
    pub cgroup_id: u64,
    /// For a cgroup link: `BPF_CGROUP_*`.
    pub attach_type: u32,
}

/// One `bpf(cmd, attr, sizeof attr)` call.
///
/// # Safety
///
/// - `T` is a `#[repr(C)]` prefix of `union bpf_attr` with the kernel's
///   layout of the member that `cmd` reads, fully initialised (padding
///   spelled out as zeroed fields);
/// - every user pointer stored in `attr` (a path, an info buffer) points
///   at memory that stays live for the call and is as large as the kernel
///   reads or writes through it for `cmd`: a NUL-terminated string for a
///   path, `info_len` writable bytes for an info buffer.
///
/// The kernel copies exactly `size_of::<T>()` bytes of `attr` and treats
/// the rest of the union as zero; file descriptors in `attr` need no
/// care (a wrong one is an error, not memory unsafety).
unsafe fn bpf<T>(cmd: libc::c_int, attr: &mut T) -> io::Result<libc::c_long> {
    // SAFETY: the caller's contract: `attr` is live and initialised, its
    // size is passed, and the pointers in it are valid for the kernel's
    // accesses during the call.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            std::ptr::from_mut(attr),
            size_of::<T>() as libc::c_uint,
        )
    };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// Takes ownership of a new fd returned by the kernel.
fn owned(fd: libc::c_long) -> io::Result<OwnedFd> {
    let raw = i32::try_from(fd).map_err(|_| io::Error::from(io::ErrorKind::InvalidData))?;
    // SAFETY: the kernel just returned `raw` as a new file descriptor of
    // this process, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a nul byte"))
}

/// Attaches program `prog` to cgroup directory `cgroup` with a new bpf
/// link of type `attach_type` (e.g. [`BPF_CGROUP_DEVICE`]); the link
/// coexists with other programs (links are always multi-attach) and lives
/// while the returned fd or a pin of it does.
pub fn cgroup_link_create(
    prog: BorrowedFd<'_>,
    cgroup: BorrowedFd<'_>,
    attach_type: u32,
) -> io::Result<OwnedFd> {
    let mut attr = LinkCreateAttr {
        prog_fd: prog.as_raw_fd() as u32,
        target_fd: cgroup.as_raw_fd() as u32,
        attach_type,
        ..LinkCreateAttr::default()
    };
    // SAFETY: `LinkCreateAttr` is the kernel's `link_create` prefix, all
    // fields initialised; it holds only fds and integers, no pointers.
    owned(unsafe { bpf(BPF_LINK_CREATE, &mut attr) }?)
}

/// Pins bpf object `fd` at `path` on a bpf file system.
pub fn obj_pin(fd: BorrowedFd<'_>, path: &Path) -> io::Result<()> {
    let path = c_path(path)?;
    let mut attr = ObjAttr {
        pathname: path.as_ptr() as u64,
        bpf_fd: fd.as_raw_fd() as u32,
        ..ObjAttr::default()
    };
    // SAFETY: `ObjAttr` is the kernel's `BPF_OBJ_*` prefix; `pathname`
    // points at the NUL-terminated `path`, which outlives the call.
    unsafe { bpf(BPF_OBJ_PIN, &mut attr) }.map(drop)
}

/// Opens the bpf object pinned at `path`.
pub fn obj_get(path: &Path) -> io::Result<OwnedFd> {
    let path = c_path(path)?;
    let mut attr = ObjAttr {
        pathname: path.as_ptr() as u64,
        ..ObjAttr::default()
    };
    // SAFETY: as in `obj_pin`: `pathname` points at the NUL-terminated
    // `path`, which outlives the call.
    owned(unsafe { bpf(BPF_OBJ_GET, &mut attr) }?)
}

/// What the kernel says about link `fd`.
pub fn link_info(fd: BorrowedFd<'_>) -> io::Result<LinkInfo> {
    let mut info = RawLinkInfo::default();
    let mut attr = InfoAttr {
        bpf_fd: fd.as_raw_fd() as u32,
        info_len: size_of::<RawLinkInfo>() as u32,
        info: std::ptr::from_mut(&mut info) as u64,
    };
    // SAFETY: `InfoAttr` is the kernel's `info` prefix; `info` points at
    // `info`, a live, writable `RawLinkInfo` of exactly `info_len` bytes,
    // which the kernel fills (at most `info_len` bytes of it).
    unsafe { bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr) }?;
    Ok(LinkInfo {
        link_type: info.link_type,
        id: info.id,
        prog_id: info.prog_id,
        cgroup_id: info.cgroup_id,
        attach_type: info.attach_type,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attr_prefixes_have_the_kernel_layout() {
        assert_eq!(size_of::<ObjAttr>(), 24);
        assert_eq!(size_of::<InfoAttr>(), 16);
        assert_eq!(size_of::<RawLinkInfo>(), 32);
        assert_eq!(std::mem::offset_of!(RawLinkInfo, cgroup_id), 16);
        assert_eq!(std::mem::offset_of!(InfoAttr, info), 8);
    }

    #[test]
    fn errors_come_from_the_kernel() {
        // Not a bpf object (or no permission): either way an error, no
        // fd leaked.
        assert!(obj_get(Path::new("/nonexistent/pin")).is_err());
        let stdin = std::io::stdin();
        use std::os::fd::AsFd;
        assert!(link_info(stdin.as_fd()).is_err());
    }
}
