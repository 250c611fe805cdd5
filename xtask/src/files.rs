//! File helpers shared by the build and setup steps.

use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// Copies `from` to `to` through a temporary name beside `to` and a
/// rename, so a process that has the old file mapped keeps a consistent
/// image.
pub fn copy_replacing(from: &Path, to: &Path) -> Result<()> {
    let mut tmp = OsString::from(to.as_os_str());
    tmp.push(".tmp-copy");
    let tmp = PathBuf::from(tmp);
    fs::copy(from, &tmp)
        .with_context(|| format!("cannot copy {} to {}", from.display(), tmp.display()))?;
    fs::rename(&tmp, to)
        .with_context(|| format!("cannot rename {} to {}", tmp.display(), to.display()))
}

/// Makes `link` a symbolic link to `target`, replacing a file or link
/// already there.
pub fn replace_symlink(target: impl AsRef<Path>, link: &Path) -> Result<()> {
    let target = target.as_ref();
    match fs::remove_file(link) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("cannot remove {}", link.display())),
    }
    std::os::unix::fs::symlink(target, link)
        .with_context(|| format!("cannot link {} -> {}", link.display(), target.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_replaces_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let (from, to) = (dir.path().join("new"), dir.path().join("lib.so.1"));
        fs::write(&from, "new").unwrap();
        fs::write(&to, "old").unwrap();
        copy_replacing(&from, &to).unwrap();
        assert_eq!(fs::read_to_string(&to).unwrap(), "new");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 2);
    }

    #[test]
    fn symlink_replaces_a_link_or_file() {
        let dir = tempfile::tempdir().unwrap();
        let link = dir.path().join("libcuda.so");
        fs::write(&link, "a file").unwrap();
        replace_symlink("libcuda.so.1", &link).unwrap();
        assert_eq!(fs::read_link(&link).unwrap(), Path::new("libcuda.so.1"));
        replace_symlink(Path::new("/elsewhere"), &link).unwrap();
        assert_eq!(fs::read_link(&link).unwrap(), Path::new("/elsewhere"));
    }
}
