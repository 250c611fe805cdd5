//! Region files on disk and their shared mappings.
//!
//! The agent creates both files in the container's region directory:
//! `control` (mode 0644, bind-mounted read-only into the container) and
//! `usage` (mode 0666, writable by the container's processes whatever
//! their user). The library maps `control` read-only — from a descriptor
//! opened `O_RDONLY`, so no write through the mapping is possible even
//! before the read-only mount — and `usage` read-write.

use std::fs::{File, OpenOptions};
use std::io;
use std::marker::PhantomData;
use std::ops::Deref;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;

use crate::control::ControlSpec;
use crate::error::{PathIoError, RegionError};
use crate::layout::{CONTROL_SIZE, ControlRegion, USAGE_SIZE, UsageRegion};

/// File name of the control region.
pub const CONTROL_FILE: &str = "control";
/// File name of the usage region.
pub const USAGE_FILE: &str = "usage";

/// The region types a file may be mapped as.
pub trait Region: sealed::Sealed {
    /// The region's name in messages.
    const NAME: &'static str;
}
impl Region for ControlRegion {
    const NAME: &'static str = "control";
}
impl Region for UsageRegion {
    const NAME: &'static str = "usage";
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::ControlRegion {}
    impl Sealed for super::UsageRegion {}
}

/// A shared mapping of a region file, viewed as `T`.
pub struct Mapped<T: Region> {
    ptr: NonNull<T>,
    len: usize,
    path: PathBuf,
    _t: PhantomData<T>,
}

// SAFETY: T is a region type (sealed) made only of atomics and plain
// integers that are never written through a shared reference except
// atomically.
unsafe impl<T: Region> Send for Mapped<T> {}
// SAFETY: as above.
unsafe impl<T: Region> Sync for Mapped<T> {}

impl<T: Region> Mapped<T> {
    fn map(file: &File, path: &Path, len: usize, writable: bool) -> Result<Self, RegionError> {
        let actual = file
            .metadata()
            .map_err(PathIoError::at("stat", path))?
            .len() as usize;
        if actual < len || len < size_of::<T>() {
            return Err(RegionError::field(
                T::NAME,
                "size",
                format!("file {} is {actual} bytes; expected {len}", path.display()),
            ));
        }
        let prot = if writable {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        // SAFETY: a fresh shared mapping of `len` bytes of a file that is at
        // least that long, at an address of the kernel's choosing.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(PathIoError::new("map", path, io::Error::last_os_error()).into());
        }
        Ok(Self {
            ptr: NonNull::new(p.cast()).ok_or_else(|| {
                PathIoError::new("map", path, io::Error::other("mmap returned null"))
            })?,
            len,
            path: path.to_path_buf(),
            _t: PhantomData,
        })
    }

    /// The file behind the mapping.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Mapped length.
    pub fn mapped_len(&self) -> usize {
        self.len
    }
}

impl<T: Region> Deref for Mapped<T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the mapping is page-aligned, at least size_of::<T>()
        // bytes (checked in map) and lives as long as self; T is valid for
        // any bit pattern its atomics and integers can hold.
        unsafe { self.ptr.as_ref() }
    }
}

impl<T: Region> Drop for Mapped<T> {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in map; no reference
        // into it outlives self.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

pub(crate) fn io_err<'a>(
    action: &'static str,
    path: &'a Path,
) -> impl FnOnce(io::Error) -> RegionError + 'a {
    move |source| PathIoError::new(action, path, source).into()
}

/// Options to open a region file read-write for the agent, without
/// following a symlink (the container can reach the region directory).
fn agent_open() -> OpenOptions {
    let mut o = OpenOptions::new();
    o.read(true).write(true).custom_flags(libc::O_NOFOLLOW);
    o
}

/// Creates `path` (or reuses it, unless `new`) with `mode` and `len` bytes.
fn create_file(path: &Path, len: usize, mode: u32, new: bool) -> Result<File, RegionError> {
    let mut o = agent_open();
    if new {
        o.create_new(true);
    } else {
        o.create(true).truncate(false);
    }
    let file = o.mode(mode).open(path).map_err(io_err("create", path))?;
    file.set_permissions(std::fs::Permissions::from_mode(mode))
        .map_err(io_err("set the mode of", path))?;
    file.set_len(len as u64).map_err(io_err("size", path))?;
    Ok(file)
}

/// Prefix of the temporary name a control file is written under.
const CONTROL_TMP_PREFIX: &str = ".control.tmp.";

/// Creates `dir/control` with `spec` and returns a writable mapping for
/// later updates (agent side).
///
/// The file is written complete under a temporary name, flushed, and
/// renamed into place, so a crash at any point leaves the previous
/// control file (or none) or the complete new one, never a half-written
/// one. Temporary files a crashed call left are removed first (one writer
/// per directory at a time).
///
/// An existing control file is *replaced*, not rewritten: the new file is
/// a new inode. Processes that mapped the old one keep seeing it whole and
/// unchanged, with the limits it had; updates through the returned mapping
/// reach the processes that open the new file. To change the limits of
/// processes that already run (and after an agent restart, I4), open the
/// existing file with [`open_control_rw`] and [`ControlRegion::write`] to it.
/// A symlink planted at `dir/control` is replaced, never followed.
pub fn create_control(
    dir: &Path,
    spec: &ControlSpec,
) -> Result<Mapped<ControlRegion>, RegionError> {
    let path = dir.join(CONTROL_FILE);
    remove_stale_temporaries(dir)?;
    let tmp = dir.join(format!("{CONTROL_TMP_PREFIX}{}", std::process::id()));
    let written = (|| {
        let file = create_file(&tmp, CONTROL_SIZE, 0o644, true)?;
        let mut m: Mapped<ControlRegion> = Mapped::map(&file, &tmp, CONTROL_SIZE, true)?;
        // SAFETY: the file is private to this function until renamed into
        // place; the header is written before anyone maps it.
        unsafe { &mut *m.ptr.as_ptr() }.init();
        m.write(spec)?;
        file.sync_all().map_err(io_err("flush", &tmp))?;
        std::fs::rename(&tmp, &path).map_err(io_err("publish", &path))?;
        m.path = path.clone();
        Ok(m)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// Removes the temporary control files of earlier calls that died before
/// renaming theirs (unlink never follows a symlink).
fn remove_stale_temporaries(dir: &Path) -> Result<(), RegionError> {
    for entry in std::fs::read_dir(dir).map_err(io_err("list", dir))? {
        let entry = entry.map_err(io_err("list", dir))?;
        if entry
            .file_name()
            .to_str()
            .is_some_and(|n| n.starts_with(CONTROL_TMP_PREFIX))
        {
            let p = entry.path();
            std::fs::remove_file(&p).map_err(io_err("remove", &p))?;
        }
    }
    Ok(())
}

/// Opens `dir/control` writable (agent side, after a restart).
pub fn open_control_rw(dir: &Path) -> Result<Mapped<ControlRegion>, RegionError> {
    let path = dir.join(CONTROL_FILE);
    let file = agent_open().open(&path).map_err(io_err("open", &path))?;
    let m: Mapped<ControlRegion> = Mapped::map(&file, &path, CONTROL_SIZE, true)?;
    m.validate(CONTROL_SIZE)?;
    Ok(m)
}

/// Opens `path` (a control file) read-only, as the container does.
pub fn open_control(path: &Path) -> Result<Mapped<ControlRegion>, RegionError> {
    let file = File::open(path).map_err(io_err("open", path))?;
    Mapped::map(&file, path, CONTROL_SIZE, false)
}

/// Creates `dir/usage` if it does not exist (agent side). An existing one
/// is kept: running processes have it mapped (invariant I4).
pub fn create_usage(dir: &Path) -> Result<(), RegionError> {
    let path = dir.join(USAGE_FILE);
    if path.exists() {
        return Ok(());
    }
    let tmp = dir.join(format!(".usage.tmp.{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let file = create_file(&tmp, USAGE_SIZE, 0o666, true)?;
    {
        let m: Mapped<UsageRegion> = Mapped::map(&file, &tmp, USAGE_SIZE, true)?;
        // SAFETY: the file is private to this function until renamed into
        // place; the header is written before anyone maps it.
        unsafe { &mut *m.ptr.as_ptr() }.init();
    }
    std::fs::rename(&tmp, &path).map_err(io_err("publish", &path))
}

/// Opens `path` (a usage file) read-write, as the container does.
pub fn open_usage(path: &Path) -> Result<Mapped<UsageRegion>, RegionError> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(io_err("open", path))?;
    let m: Mapped<UsageRegion> = Mapped::map(&file, path, USAGE_SIZE, true)?;
    m.validate(USAGE_SIZE)?;
    Ok(m)
}

/// Opens a usage file for the agent to read: never through a symlink,
/// never blocking on a FIFO, and only a regular file (the container
/// controls the file).
pub(crate) fn open_usage_for_reading(
    path: &Path,
) -> Result<(File, std::fs::Metadata), RegionError> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(io_err("open", path))?;
    let meta = file.metadata().map_err(io_err("stat", path))?;
    if !meta.is_file() {
        return Err(RegionError::field(
            "usage",
            "file",
            format!("{} is not a regular file", path.display()),
        ));
    }
    Ok((file, meta))
}

/// Reads a usage file's bytes (agent side; see [`crate::reader`]). The
/// container controls the file: a symlink, FIFO, device or oversized file
/// is refused or cut, so reading it can neither hang nor exhaust the agent.
pub fn read_usage_bytes(path: &Path) -> Result<Vec<u8>, RegionError> {
    use std::io::Read;
    let (file, _) = open_usage_for_reading(path)?;
    let mut bytes = Vec::with_capacity(USAGE_SIZE);
    file.take(USAGE_SIZE as u64)
        .read_to_end(&mut bytes)
        .map_err(io_err("read", path))?;
    Ok(bytes)
}

/// Reads the first `len` bytes (at most [`USAGE_SIZE`]) of a usage file
/// into `buf` (agent side; its capacity is kept between calls, so a loop
/// over many containers allocates nothing; a reader that comes back every
/// period keeps the file open with [`crate::usage_file::UsageFile`]). The same refusals as
/// [`read_usage_bytes`]; a file shorter than a whole region is refused by
/// its size, whatever `len` is, so a truncated file never passes as a
/// short read.
pub fn read_usage_prefix(path: &Path, len: usize, buf: &mut Vec<u8>) -> Result<(), RegionError> {
    crate::usage_file::UsageFile::default().read_prefix(path, len, buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::GpuLimits;

    #[test]
    fn the_agent_never_follows_a_symlinked_control_file() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("elsewhere");
        std::fs::write(&target, b"precious").unwrap();
        let control = dir.path().join(CONTROL_FILE);
        std::os::unix::fs::symlink(&target, &control).unwrap();
        assert!(open_control_rw(dir.path()).is_err());
        // A planted temporary name is removed, not written through.
        let tmp = dir
            .path()
            .join(format!("{CONTROL_TMP_PREFIX}{}", std::process::id()));
        std::os::unix::fs::symlink(&target, &tmp).unwrap();
        let spec = ControlSpec {
            flags: 0,
            gpus: vec![],
        };
        create_control(dir.path(), &spec).unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"precious", "untouched");
        let meta = std::fs::symlink_metadata(&control).unwrap();
        assert!(meta.is_file(), "the link was replaced by a control file");
        assert!(!tmp.exists());
    }

    #[test]
    fn recreating_control_replaces_the_file_and_leaves_mappings_whole() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(CONTROL_FILE);
        let a = ControlSpec {
            flags: 0,
            gpus: vec![GpuLimits::unlimited([1; 16])],
        };
        let mut b = a.clone();
        b.gpus[0].memory_limit = 1 << 30;
        b.gpus.push(GpuLimits::unlimited([2; 16]));
        let _w = create_control(dir.path(), &a).unwrap();
        let held = open_control(&path).unwrap();
        let before = std::fs::metadata(&path).unwrap().ino();
        let w2 = create_control(dir.path(), &b).unwrap();
        assert_eq!(w2.path(), path);
        assert_ne!(
            std::fs::metadata(&path).unwrap().ino(),
            before,
            "a new inode"
        );
        // The old mapping is unaffected: whole, valid, the old limits.
        held.validate(CONTROL_SIZE).unwrap();
        let old = held.snapshot();
        assert_eq!((old.flags, old.gpus), (a.flags, a.gpus.clone()));
        // New opens, and updates through the returned mapping, see the new file.
        let fresh = open_control(&path).unwrap();
        assert_eq!(fresh.snapshot().gpus, b.gpus);
        let mut c = b.clone();
        c.gpus[1].launch_rate = 5;
        w2.write(&c).unwrap();
        assert_eq!(fresh.snapshot().gpus, c.gpus);
        assert_eq!(held.snapshot().gpus, a.gpus);
        // Nothing but the two region names is left behind.
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, [CONTROL_FILE]);
    }

    #[test]
    fn a_short_control_file_is_reported_as_control() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(CONTROL_FILE), [0u8; 100]).unwrap();
        let e = open_control_rw(dir.path()).err().unwrap().to_string();
        assert!(e.contains("control"), "{e}");
        assert!(!e.contains("usage"), "{e}");
    }

    #[test]
    fn files_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let spec = ControlSpec {
            flags: 0,
            gpus: vec![GpuLimits::unlimited([1; 16])],
        };
        let w = create_control(dir.path(), &spec).unwrap();
        create_usage(dir.path()).unwrap();
        let r = open_control(&dir.path().join(CONTROL_FILE)).unwrap();
        r.validate(CONTROL_SIZE).unwrap();
        assert_eq!(r.snapshot().gpus, spec.gpus);
        let mut spec2 = spec.clone();
        spec2.gpus[0].memory_limit = 123;
        w.write(&spec2).unwrap();
        assert_eq!(r.gpu(0).0.memory_limit, 123, "updates are visible");
        let u = open_usage(&dir.path().join(USAGE_FILE)).unwrap();
        let s = u.claim(7, 1).unwrap().slot;
        u.reserve(0, s, 99, 1000).unwrap();
        let snap = crate::reader::read_usage(&read_usage_bytes(u.path()).unwrap()).unwrap();
        assert_eq!(snap.used[0], 99);
        assert_eq!(snap.slots[0].pid, 7);
        // Re-creating keeps the existing usage file.
        create_usage(dir.path()).unwrap();
        assert_eq!(u.used_bytes(0), 99);
        let mode = std::fs::metadata(dir.path().join(CONTROL_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o644);
    }

    #[test]
    fn short_files_are_rejected_with_the_size() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("control");
        std::fs::write(&p, b"short").unwrap();
        let e = open_control(&p).err().unwrap().to_string();
        assert!(e.contains("5 bytes"), "{e}");
    }
}
