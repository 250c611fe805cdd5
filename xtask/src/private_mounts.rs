//! Running a command in a mount namespace of its own, where bpffs,
//! tracefs and debugfs start unmounted: what `cargo xtask test` runs the
//! tests in, as root.
//!
//! Why: a new node (or CI machine) may have none of them mounted, and the
//! agent must mount what it needs itself. Tests run on a developer's
//! machine, where they usually are mounted, would never notice code that
//! forgets; here every test meets a new node. And whatever the tests
//! mount or pin stays in the namespace: it goes when the last test process
//! exits, and the host's mounts and pins are never touched.
//!
//! How: `xtask in-private-mounts -- PROGRAM ARGS…` unshares its mount
//! namespace (`unshare(CLONE_NEWNS)`), makes every mount private
//! (`MS_REC | MS_PRIVATE` on `/`, so that nothing below propagates to or
//! from the host), lazily unmounts every mount of a [`HIDDEN`] type found
//! in `/proc/self/mountinfo` (debugfs too, whose `tracing` directory would
//! automount tracefs again), checks that none is left, and then execs
//! the command, which inherits the namespace, as do its children.

use std::ffi::OsString;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use rustix::mount::{MountPropagationFlags, UnmountFlags, mount_change, unmount};

use crate::sys;

/// File system types unmounted in the namespace.
pub const HIDDEN: [&str; 3] = ["bpf", "tracefs", "debugfs"];

/// The hidden subcommand's name.
pub const SUBCOMMAND: &str = "in-private-mounts";

const MOUNTINFO: &str = tessera_mountinfo::SELF;

#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    /// The command to run, and its arguments.
    #[arg(last = true, required = true)]
    pub command: Vec<OsString>,
}

/// The running xtask binary. Not its path: `cargo xtask test` builds the
/// workspace, xtask included, so by the time the tests run the file at
/// that path is a new build and the running one is deleted. The kernel's
/// link to the running image execs that image whatever became of its file.
const RUNNING_XTASK: &str = "/proc/self/exe";

/// `program` run through `xtask in-private-mounts`; add its arguments.
pub fn wrap(program: impl Into<OsString>) -> Command {
    let mut cmd = Command::new(RUNNING_XTASK);
    cmd.args([SUBCOMMAND.into(), "--".into(), program.into()]);
    cmd
}

/// Enters the namespace and execs `args.command`; returns only on failure.
pub fn run(args: &Args) -> Result<()> {
    let (program, rest) = args
        .command
        .split_first()
        .context("no command to run in the private mount namespace")?;
    enter()?;
    let err = Command::new(program).args(rest).exec();
    Err(err).with_context(|| format!("cannot run {}", Path::new(program).display()))
}

/// Moves this process into a mount namespace of its own, private to it,
/// without mounts of a [`HIDDEN`] type. Returns the mount points it
/// unmounted.
pub fn enter() -> Result<Vec<PathBuf>> {
    sys::unshare_mount_namespace().context(
        "cannot make a private mount namespace for the tests \
         (unshare(CLONE_NEWNS) needs CAP_SYS_ADMIN, as the privileged tests do)",
    )?;
    // Before any unmount: a shared mount would carry it to the host.
    mount_change(
        "/",
        MountPropagationFlags::PRIVATE | MountPropagationFlags::REC,
    )
    .context("cannot make the mounts of the new mount namespace private")?;
    let mut unmounted = Vec::new();
    loop {
        let table = std::fs::read_to_string(MOUNTINFO)
            .with_context(|| format!("cannot read {MOUNTINFO}"))?;
        let Some(target) = hidden_mounts(&table).into_iter().next() else {
            return Ok(unmounted);
        };
        // Each round removes at least the mount it names, so the table
        // shrinks; a mount that cannot go fails here.
        if unmounted.len() > 1000 {
            bail!("mounts at {} keep coming back", target.display());
        }
        unmount(&target, UnmountFlags::DETACH).with_context(|| {
            format!(
                "cannot unmount {} in the private mount namespace",
                target.display()
            )
        })?;
        unmounted.push(target);
    }
}

/// The mount points of [`HIDDEN`] file systems in mountinfo `text`
/// (`proc(5)`), deepest first and, at one mount point, the last mounted
/// (the visible one) first.
pub fn hidden_mounts(text: &str) -> Vec<PathBuf> {
    let mut found: Vec<(usize, PathBuf)> = tessera_mountinfo::parse(text)
        .enumerate()
        .filter(|(_, m)| HIDDEN.contains(&m.fs_type.as_str()))
        .map(|(order, m)| (order, m.mount_point))
        .collect();
    found.sort_by(|(a_order, a), (b_order, b)| {
        let depth = |p: &Path| p.components().count();
        depth(b).cmp(&depth(a)).then(b_order.cmp(a_order))
    });
    found.into_iter().map(|(_, p)| p).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_every_hidden_mount_deepest_and_topmost_first() {
        let table = "\
22 1 0:21 / /sys rw,nosuid shared:7 - sysfs sysfs rw
23 22 0:7 / /sys/kernel/debug rw shared:9 - debugfs debugfs rw
24 23 0:12 / /sys/kernel/debug/tracing rw - tracefs tracefs rw
25 22 0:13 / /sys/kernel/tracing rw - tracefs tracefs rw
26 22 0:40 / /sys/fs/bpf rw shared:11 - bpf bpf rw,mode=700
27 22 0:41 / /sys/fs/bpf rw - bpf bpf rw
28 1 0:42 / /run/my\\040pins rw - bpf none rw
29 1 0:43 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw
not a mountinfo line
";
        let found: Vec<String> = hidden_mounts(table)
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        assert_eq!(
            found,
            [
                "/sys/kernel/debug/tracing",
                "/sys/fs/bpf",
                "/sys/fs/bpf",
                "/sys/kernel/tracing",
                "/sys/kernel/debug",
                "/run/my pins",
            ]
        );
        assert!(hidden_mounts("29 1 0:43 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw").is_empty());
    }
}
