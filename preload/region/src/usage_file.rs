//! The agent's reads of a usage file, period after period.
//!
//! The container controls its usage file: it can rewrite, truncate,
//! rename or replace it, or plant a symlink or FIFO in its place. The
//! agent reads the file every period, so [`UsageFile`] keeps the file it
//! opened and, each read, first looks at the path without following it
//! (`lstat`): the kept descriptor is used only while the path still names
//! that same regular file (device and inode) — otherwise the path is opened
//! again, with the refusals of a first open. A read is one `pread` of the
//! bytes asked for: a file shorter than a whole region is refused by its
//! size, and one cut between the look and the read by the short read.
//!
//! Invariant: the bytes returned are the current content of the file the
//! path names at the look, or of the one it named one look earlier when
//! the path is replaced between the look and the read (the next read sees
//! the replacement); never of a file the path stopped naming before the look.

use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;

use crate::error::RegionError;
use crate::file::{io_err, open_usage_for_reading};
use crate::layout::USAGE_SIZE;

/// An open usage file and the identity it had when opened.
#[derive(Debug, Default)]
pub struct UsageFile {
    open: Option<(File, Identity)>,
}

/// Device and inode of a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Identity {
    dev: u64,
    ino: u64,
}

impl Identity {
    fn of(m: &std::fs::Metadata) -> Self {
        Self {
            dev: m.dev(),
            ino: m.ino(),
        }
    }
}

impl UsageFile {
    /// Reads the first `len` bytes (at most [`USAGE_SIZE`]) of the usage
    /// file at `path` into `buf` (its capacity is kept between calls).
    pub fn read_prefix(
        &mut self,
        path: &Path,
        len: usize,
        buf: &mut Vec<u8>,
    ) -> Result<(), RegionError> {
        let looked = match std::fs::symlink_metadata(path) {
            Ok(m) => m,
            Err(e) => {
                self.open = None;
                return Err(io_err("stat", path)(e));
            }
        };
        let kept = self
            .open
            .take()
            .filter(|(_, id)| looked.is_file() && *id == Identity::of(&looked));
        let (file, id, size) = match kept {
            Some((file, id)) => (file, id, looked.len()),
            None => {
                let (file, meta) = open_usage_for_reading(path)?;
                (file, Identity::of(&meta), meta.len())
            }
        };
        if size < USAGE_SIZE as u64 {
            return Err(RegionError::field(
                "usage",
                "size",
                format!(
                    "file {} is {size} bytes; expected {USAGE_SIZE}",
                    path.display()
                ),
            ));
        }
        buf.clear();
        buf.resize(len.min(USAGE_SIZE), 0);
        file.read_exact_at(buf, 0).map_err(io_err("read", path))?;
        self.open = Some((file, id));
        Ok(())
    }

    /// Reads the first `len` bytes of the file the last [`Self::read_prefix`]
    /// opened, without looking at the path again; `Ok(false)` when none is
    /// open. For a cheap look at whether the processes that mapped that
    /// file wrote to it (they keep writing to it whatever the path names
    /// now); a path replaced since is seen by the next `read_prefix`. The
    /// invariant above holds for `read_prefix` only.
    pub fn read_kept_prefix(
        &self,
        path: &Path,
        len: usize,
        buf: &mut Vec<u8>,
    ) -> Result<bool, RegionError> {
        let Some((file, _)) = &self.open else {
            return Ok(false);
        };
        buf.clear();
        buf.resize(len.min(USAGE_SIZE), 0);
        file.read_exact_at(buf, 0).map_err(io_err("read", path))?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kept read follows the file opened, not the path: a replaced
    /// path is not seen by it, and is by the next full read.
    #[test]
    fn the_kept_read_reads_the_file_opened_until_the_next_look() {
        let dir = tempfile::tempdir().unwrap();
        let path = region(dir.path(), 1);
        let mut f = UsageFile::default();
        let mut buf = Vec::new();
        assert!(!f.read_kept_prefix(&path, 64, &mut buf).unwrap());
        f.read_prefix(&path, 64, &mut buf).unwrap();
        // The old file rewritten in place: seen.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .write_all_at(&[5; 8], 0)
            .unwrap();
        assert!(f.read_kept_prefix(&path, 64, &mut buf).unwrap());
        assert_eq!(&buf[..9], &[5, 5, 5, 5, 5, 5, 5, 5, 1]);
        // Replaced by rename: the kept read still reads the old one.
        let other = region(dir.path(), 2);
        std::fs::rename(&other, &path).unwrap();
        assert!(f.read_kept_prefix(&path, 64, &mut buf).unwrap());
        assert_eq!(buf[8], 1);
        f.read_prefix(&path, 64, &mut buf).unwrap();
        assert_eq!(buf, [2; 64]);
    }

    fn region(dir: &Path, fill: u8) -> std::path::PathBuf {
        let path = dir.join(format!("u{fill}"));
        std::fs::write(&path, vec![fill; USAGE_SIZE]).unwrap();
        path
    }

    /// A usage file of ones at `dir/usage`, read once (so it is kept).
    fn kept() -> (tempfile::TempDir, std::path::PathBuf, UsageFile, Vec<u8>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("usage");
        std::fs::rename(region(dir.path(), 1), &path).unwrap();
        let mut f = UsageFile::default();
        let mut buf = Vec::new();
        f.read_prefix(&path, 64, &mut buf).unwrap();
        (dir, path, f, buf)
    }

    #[test]
    fn a_kept_file_follows_rewrites_and_a_replaced_one_is_reopened() {
        let (dir, path, mut f, mut buf) = kept();
        assert_eq!(buf, vec![1; 64]);
        // Written in place (as the preload does): the kept file shows it.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .write_all_at(&[7; 8], 0)
            .unwrap();
        f.read_prefix(&path, 16, &mut buf).unwrap();
        assert_eq!(buf, [[7; 8], [1; 8]].concat());
        // Replaced by another file: read from the new one at once.
        std::fs::rename(region(dir.path(), 2), &path).unwrap();
        f.read_prefix(&path, 64, &mut buf).unwrap();
        assert_eq!(buf, vec![2; 64], "read the file the path no longer names");
    }

    #[test]
    fn a_symlink_fifo_or_short_file_in_its_place_is_refused() {
        let (dir, path, mut f, mut buf) = kept();
        // A symlink to a valid region, planted over the kept file.
        let elsewhere = region(dir.path(), 3);
        std::fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &path).unwrap();
        let e = f.read_prefix(&path, 64, &mut buf).unwrap_err();
        assert!(e.to_string().contains("open"), "{e}");
        // A FIFO: refused without blocking.
        std::fs::remove_file(&path).unwrap();
        mkfifo(&path);
        assert!(f.read_prefix(&path, 64, &mut buf).is_err());
        // The kept file truncated in place: refused by its size.
        std::fs::remove_file(&path).unwrap();
        std::fs::rename(region(dir.path(), 4), &path).unwrap();
        f.read_prefix(&path, 64, &mut buf).unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(100)
            .unwrap();
        let e = f.read_prefix(&path, 64, &mut buf).unwrap_err();
        assert!(e.to_string().contains("100 bytes"), "{e}");
        // Gone: an error, and nothing kept.
        std::fs::remove_file(&path).unwrap();
        assert!(f.read_prefix(&path, 64, &mut buf).is_err());
        assert!(f.open.is_none());
    }

    fn mkfifo(path: &Path) {
        let status = std::process::Command::new("mkfifo")
            .arg(path)
            .status()
            .unwrap();
        assert!(status.success());
    }
}
