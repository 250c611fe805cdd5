//! `xtask in-private-mounts`, what `cargo xtask test` runs the tests in
//! as root: the command sees no bpffs, tracefs or debugfs, what it mounts
//! stays out of this (the host's) namespace, and its exit status comes
//! back. Skipped (with the reason) without root.
#![allow(clippy::unwrap_used)] // helpers of a test crate

use std::process::{Command, Output};

const HIDDEN: [&str; 3] = ["bpf", "tracefs", "debugfs"];

fn root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// `(type, mount point)` of the hidden file systems in a mountinfo text.
fn hidden(mountinfo: &str) -> Vec<(String, String)> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let fs = right.split_whitespace().next()?;
            let at = left.split_whitespace().nth(4)?;
            HIDDEN.contains(&fs).then(|| (fs.to_owned(), at.to_owned()))
        })
        .collect()
}

fn here() -> Vec<(String, String)> {
    hidden(&std::fs::read_to_string("/proc/self/mountinfo").unwrap())
}

fn in_private_mounts(script: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(["in-private-mounts", "--", "sh", "-c", script])
        .output()
        .unwrap()
}

fn shared(mountinfo: &str) -> usize {
    mountinfo
        .lines()
        .filter(|l| {
            l.split_once(" - ")
                .is_some_and(|(left, _)| left.contains(" shared:"))
        })
        .count()
}

/// Run in an outer mount namespace of its own whose mounts are all
/// shared, with bpffs and tracefs mounted, so that the host is never
/// touched and a leak to the outside would show there.
#[test]
fn the_command_sees_no_bpffs_tracefs_or_debugfs_and_its_mounts_stay_there() {
    if !root() {
        println!("skipped: not root");
        return;
    }
    let before = here();
    let pin = format!("/sys/fs/bpf/tessera-xtask-test-{}", std::process::id());
    let xtask = env!("CARGO_BIN_EXE_xtask");
    let inner = format!(
        "cat /proc/self/mountinfo && echo ==== && \
         mount -t bpf bpf /sys/fs/bpf && mkdir {pin} && \
         mount -t tracefs tracefs /sys/kernel/tracing && cat /proc/self/mountinfo"
    );
    let outer = format!(
        "set -e
         mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf
         mountpoint -q /sys/kernel/tracing || mount -t tracefs tracefs /sys/kernel/tracing
         mount --make-rshared /
         cat /proc/self/mountinfo; echo ====
         {xtask} in-private-mounts -- sh -c '{inner}'
         echo ====; cat /proc/self/mountinfo
         test ! -e {pin}"
    );
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "shared", "sh", "-c", &outer])
        .output()
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "{}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    let parts: Vec<&str> = stdout.split("====").collect();
    let [outer_before, inner_start, inner_after, outer_after] = parts[..] else {
        panic!("unexpected output: {stdout}");
    };
    assert!(shared(outer_before) > 0, "the trap is set: {outer_before}");
    let outer_hidden = hidden(outer_before);
    for want in [("bpf", "/sys/fs/bpf"), ("tracefs", "/sys/kernel/tracing")] {
        assert!(
            outer_hidden.contains(&(want.0.to_owned(), want.1.to_owned())),
            "{outer_hidden:?}"
        );
    }

    // The command starts with none of them, and no mount shared.
    assert_eq!(hidden(inner_start), []);
    assert_eq!(shared(inner_start), 0, "{inner_start}");
    let mut mounted = hidden(inner_after);
    mounted.sort();
    assert_eq!(
        mounted,
        [
            ("bpf".to_owned(), "/sys/fs/bpf".to_owned()),
            ("tracefs".to_owned(), "/sys/kernel/tracing".to_owned()),
        ]
    );

    // Neither its unmounts nor its mounts reached the outside.
    assert_eq!(hidden(outer_after), outer_hidden);
    assert_eq!(here(), before);
}

#[test]
fn the_exit_status_and_refusals_come_back() {
    if !root() {
        println!("skipped: not root");
        return;
    }
    assert_eq!(in_private_mounts("exit 7").status.code(), Some(7));
    let out = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(["in-private-mounts", "--", "/nonexistent/program"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("cannot run /nonexistent/program"),
        "{stderr}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .arg("in-private-mounts")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "a command is required: {out:?}");
}
