//! Which NVIDIA driver the node runs, for the parameter layouts the
//! programs decode (`NV_ESC_RM_ALLOC` grew in 535).
//!
//! The kernel module names its version in `/proc/driver/nvidia/version`
//! ("NVRM version: NVIDIA UNIX ... Kernel Module  595.45.04  Release
//! Build ..."). Without a driver (stand-ins, the simulator) the version
//! is configured; failing that the newest layouts are assumed.

use std::path::Path;

use tessera_ebpf_common::rm::RmLayout;

/// Where the kernel module reports its version.
pub const PROC_VERSION: &str = "/proc/driver/nvidia/version";
/// The driver major assumed when none is found or configured: the newest
/// checked (`reference/ebpf.md` §2).
pub const DEFAULT_MAJOR: u32 = 595;

/// The driver major in the text of `/proc/driver/nvidia/version`.
pub fn major_from_proc(text: &str) -> Option<u32> {
    let line = text.lines().find(|l| l.starts_with("NVRM version:"))?;
    line.split_whitespace().find_map(major_of_version)
}

/// The major of a version string such as `595.45.04` (also `535.43`):
/// two or three dot-separated numbers.
pub fn major_of_version(version: &str) -> Option<u32> {
    let parts: Vec<&str> = version.split('.').collect();
    let numeric = |p: &&str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit());
    if !(2..=3).contains(&parts.len()) || !parts.iter().all(numeric) {
        return None;
    }
    parts[0].parse().ok()
}

/// The driver major of this node: the running module's, else `None`.
pub fn running_major(proc_version: &Path) -> Option<u32> {
    major_from_proc(&std::fs::read_to_string(proc_version).ok()?)
}

/// The RM layouts for `configured` (a driver major), else the running
/// module's, else [`DEFAULT_MAJOR`]'s; with the major used.
pub fn rm_layout(configured: Option<u32>) -> (RmLayout, u32) {
    let major = configured
        .or_else(|| running_major(Path::new(PROC_VERSION)))
        .unwrap_or(DEFAULT_MAJOR);
    (RmLayout::for_driver_major(major), major)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_module_version() {
        let text = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  595.45.04  \
                    Release Build  (dvs-builder@U22-I3-AM02-24-3)  Tue Jan 13 2026\n\
                    GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n";
        assert_eq!(major_from_proc(text), Some(595));
        let old = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  525.147.05  Wed Oct 25 2023\n";
        assert_eq!(major_from_proc(old), Some(525));
        assert_eq!(major_from_proc("GCC version: 12.2.0\n"), None);
        assert_eq!(major_from_proc("NVRM version: NVIDIA UNIX x86_64\n"), None);
    }

    #[test]
    fn parses_version_strings() {
        assert_eq!(major_of_version("535.43.02"), Some(535));
        assert_eq!(major_of_version("550.54"), Some(550));
        assert_eq!(major_of_version("x86_64"), None);
        assert_eq!(major_of_version("12.2.0)"), None);
        assert_eq!(major_of_version("595."), None);
    }

    #[test]
    fn configured_major_wins() {
        let (layout, major) = rm_layout(Some(530));
        assert_eq!(major, 530);
        assert_eq!(layout.nvos64_size, 40);
    }
}
