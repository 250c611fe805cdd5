//! The mounts of this process's mount namespace, from
//! `/proc/self/mountinfo` (`proc(5)`): what is mounted where, and which
//! part of its file system. The agent's (cgroup v2 root, bpffs and
//! tracefs mounts) and xtask's (the tests' private mount namespace, the
//! demo's cgroups) one reader of that table; std only, so that xtask can
//! use it without building the agent.

use std::path::PathBuf;

/// This process's mount table.
pub const SELF: &str = "/proc/self/mountinfo";

/// One line of mountinfo.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mount {
    /// The directory of the file system mounted here (`/` for all of it).
    pub root: String,
    /// Where it is mounted.
    pub mount_point: PathBuf,
    /// The file system type, e.g. `cgroup2`.
    pub fs_type: String,
    /// The optional fields: propagation (`shared:N`, `master:N`,
    /// `propagate_from:N`, `unbindable`); none for a private mount.
    pub optional: Vec<String>,
}

impl Mount {
    /// Whether mounts and unmounts below it propagate to its peers
    /// (`shared:N`).
    pub fn is_shared(&self) -> bool {
        self.optional.iter().any(|f| f.starts_with("shared:"))
    }
}

/// The mounts in mountinfo `text`, paths unescaped; malformed lines are
/// skipped.
pub fn parse(text: &str) -> impl Iterator<Item = Mount> + '_ {
    text.lines().filter_map(|line| {
        // "<id> <parent> <dev> <root> <mount point> <options> [<optional>…]
        //  - <type> <source> <super options>"
        let (left, right) = line.split_once(" - ")?;
        let mut fields = left.split_whitespace();
        let root = fields.nth(3)?;
        let mount_point = fields.next()?;
        let _options = fields.next()?;
        Some(Mount {
            root: unescape(root),
            mount_point: PathBuf::from(unescape(mount_point)),
            fs_type: right.split_whitespace().next()?.to_owned(),
            optional: fields.map(str::to_owned).collect(),
        })
    })
}

/// The mounts of this process.
pub fn read() -> std::io::Result<Vec<Mount>> {
    Ok(parse(&std::fs::read_to_string(SELF)?).collect())
}

/// Undoes mountinfo's octal escapes (`\040` for a space).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes.get(i + 1..i + 4).and_then(|d| {
            let s = std::str::from_utf8(d).ok()?;
            u8::from_str_radix(s, 8).ok()
        });
        match (bytes[i], octal) {
            (b'\\', Some(b)) => {
                out.push(b);
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_lines_and_unescapes_paths() {
        let text = "\
25 30 0:22 / /sys rw,nosuid shared:7 - sysfs sysfs rw
41 30 0:27 /kube\\040pods /mnt/my\\040cgroups rw - cgroup2 cgroup2 rw
garbage
";
        let mounts: Vec<Mount> = parse(text).collect();
        assert_eq!(mounts.len(), 2);
        assert_eq!(mounts[0].mount_point, PathBuf::from("/sys"));
        assert_eq!(mounts[0].fs_type, "sysfs");
        assert_eq!(mounts[1].root, "/kube pods");
        assert_eq!(mounts[1].mount_point, PathBuf::from("/mnt/my cgroups"));
        assert_eq!(mounts[1].fs_type, "cgroup2");
        assert!(mounts[0].is_shared());
        assert!(!mounts[1].is_shared() && mounts[1].optional.is_empty());
    }

    #[test]
    fn reads_this_process_mounts() {
        assert!(read().unwrap().iter().any(|m| m.fs_type == "proc"));
    }
}
