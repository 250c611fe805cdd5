//! The system calls xtask makes that Rust's std and rustix's safe API do
//! not cover; the only unsafe code of xtask.

use rustix::thread::{UnshareFlags, unshare_unsafe};

/// Moves the calling thread (and the processes it starts from now on)
/// into a new mount namespace, a copy of the current one.
pub fn unshare_mount_namespace() -> std::io::Result<()> {
    // SAFETY: `unshare_unsafe` is unsafe because of `UnshareFlags::FILES`,
    // which would give this thread a file descriptor table of its own
    // while other threads still hold descriptors from the shared one.
    // Only NEWNS is passed (the kernel adds FS, the cwd and umask): the
    // descriptor table stays shared, so every descriptor stays valid in
    // every thread.
    unsafe { unshare_unsafe(UnshareFlags::NEWNS) }?;
    Ok(())
}
