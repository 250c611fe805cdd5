//! The regions from the container's side: the control region cannot be
//! written, broken regions give the documented errors, and processes that
//! never use a GPU are left alone.

mod common;

use std::process::Command;

use common::{Container, Link, MIB, field, libtessera, memory_limit};
use tessera_region::control::ControlSpec;
use tessera_region::layout::FLAG_FAIL_OPEN;

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

#[test]
fn the_library_maps_control_read_only() {
    let c = Container::new(|u| memory_limit(u, 1000));
    let p = c.spawn_ready(Link::Direct, "dev 0 ready hold");
    let maps = std::fs::read_to_string(format!("/proc/{}/maps", p.pid())).unwrap();
    let control = maps
        .lines()
        .find(|l| l.ends_with("/region/control"))
        .expect("control mapped");
    assert!(control.contains(" r--s "), "{control}");
    let usage = maps
        .lines()
        .find(|l| l.ends_with("/region/usage"))
        .expect("usage mapped");
    assert!(usage.contains(" rw-s "), "{usage}");
}

#[test]
fn a_container_cannot_write_its_control_region() {
    let can_unshare = Command::new("unshare")
        .args(["-m", "--propagation", "private", "true"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !is_root() || !can_unshare {
        println!("skipped: needs root and unshare(1) allowed to make a mount namespace");
        return;
    }
    let c = Container::new(|u| memory_limit(u, 1000));
    let control = c.region.join("control");
    let workload = common::sim::workload(Link::Direct);
    // As the agent mounts it: a read-only bind mount, in a private mount
    // namespace (the container's). Root inside cannot write it either.
    let script = format!(
        "mount --bind {ctl} {ctl} && mount -o remount,bind,ro {ctl} && \
         {{ echo garbage >> {ctl}; }} 2>&1; echo write-rc=$?; exec {wl} dev 0 alloc-until-oom 100",
        ctl = control.display(),
        wl = workload.display()
    );
    let out = c
        .command(std::path::Path::new("unshare"))
        .args(["-m", "--propagation", "private", "sh", "-c", &script])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("Read-only file system"), "{stdout}");
    assert!(!stdout.contains("write-rc=0"), "{stdout}");
    // The limits still hold for that process.
    assert_eq!(
        field(&stdout, "allocs"),
        ["7", "CUDA_ERROR_OUT_OF_MEMORY"],
        "{stdout}"
    );
    // And the file is unchanged outside.
    assert_eq!(c.control.snapshot().gpus[0].memory_limit, 1000 * MIB);
}

fn refused(c: &Container) -> String {
    let out = c.output(Link::Direct, "dev 0 alloc 1");
    assert!(!out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "error init CUDA_ERROR_NOT_PERMITTED"
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn broken_regions_refuse_gpu_use_with_a_clear_error() {
    // Missing region.
    let c = Container::new(|u| memory_limit(u, 1000));
    std::fs::remove_file(c.region.join("control")).unwrap();
    let e = refused(&c);
    assert!(
        e.contains("tessera: refusing GPU use: no usable control region"),
        "{e}"
    );
    assert!(e.contains("TESSERA_REGION_DIR"), "{e}");

    // Corrupt control magic.
    let c = Container::new(|u| memory_limit(u, 1000));
    let path = c.region.join("control");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[0] = b'X';
    std::fs::write(&path, &bytes).unwrap();
    let e = refused(&c);
    assert!(e.contains("control region: magic is not TSRCTL"), "{e}");

    // Another ABI version.
    let c = Container::new(|u| memory_limit(u, 1000));
    let mut bytes = std::fs::read(path_of(&c)).unwrap();
    bytes[8] = 9;
    std::fs::write(path_of(&c), &bytes).unwrap();
    let e = refused(&c);
    assert!(e.contains("abi_version is 9"), "{e}");

    // Corrupt usage region.
    let c = Container::new(|u| memory_limit(u, 1000));
    std::fs::write(c.region.join("usage"), b"short").unwrap();
    let e = refused(&c);
    assert!(e.contains("usage"), "{e}");
}

fn path_of(c: &Container) -> std::path::PathBuf {
    c.region.join("control")
}

#[test]
fn fail_open_policy_passes_through_an_unusable_region() {
    let c = Container::new(|u| memory_limit(u, 1000));
    c.control
        .write(&ControlSpec {
            flags: FLAG_FAIL_OPEN,
            gpus: c.control.snapshot().gpus,
        })
        .unwrap();
    let mut bytes = std::fs::read(path_of(&c)).unwrap();
    bytes[8] = 9;
    std::fs::write(path_of(&c), &bytes).unwrap();
    let out = c.output(Link::Direct, "dev 0 alloc 2000");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("fail-open: GPU use is not limited"),
        "{stderr}"
    );
    assert_eq!(
        field(&String::from_utf8_lossy(&out.stdout), "alloc"),
        ["CUDA_SUCCESS"]
    );
}

#[test]
fn a_full_process_table_is_a_clear_error() {
    let c = Container::new(|u| memory_limit(u, 1000));
    let usage = tessera_region::file::open_usage(&c.region.join("usage")).unwrap();
    // Every slot held by a live process (this test).
    let me = std::process::id();
    let start = gpusim::procfs::self_start_time();
    while usage.claim(me, start).is_some() {}
    let e = refused(&c);
    assert!(e.contains("has no free process slot (256 in use)"), "{e}");
    // Nothing was corrupted: the table is still readable and full of us.
    let snap = c.usage();
    assert_eq!(snap.slots.len(), 256);
    assert!(snap.slots.iter().all(|s| s.pid == me));
}

#[test]
fn processes_that_never_use_a_gpu_are_left_alone() {
    // No region at all: a shell and a dlsym user run as without the library.
    let out = Command::new("sh")
        .args(["-c", "echo hello"])
        .env("LD_PRELOAD", libtessera())
        .env_remove("TESSERA_REGION_DIR")
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hello\n");
    assert_eq!(String::from_utf8_lossy(&out.stderr), "", "nothing printed");

    let dir = tempfile::tempdir().unwrap();
    let probe = dir.path().join("probe");
    common::sim::cc(&[
        concat!(env!("CARGO_MANIFEST_DIR"), "/tests/c/dlsym_probe.c"),
        "-o",
        probe.to_str().unwrap(),
        "-ldl",
    ]);
    let out = Command::new(&probe)
        .env("LD_PRELOAD", libtessera())
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "default same\nnext same\nlibc-cuda absent\nmissing absent\n"
    );
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");
}

/// The containers of a pod sharing a DRA claim share one region from two
/// pid namespaces, each process pid 1 in its own: neither takes the other
/// for dead (its pid names another process, or none, in the other's
/// namespace), so what they hold together stays within the one limit.
#[test]
fn two_pid_namespaces_share_one_limit() {
    let can_unshare = Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc", "true"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !is_root() || !can_unshare {
        println!("skipped: needs root and unshare(1) allowed to make a pid namespace");
        return;
    }
    let c = Container::new(|u| tessera_region::control::GpuLimits {
        memory_limit: 1000 * MIB,
        ..tessera_region::control::GpuLimits::unlimited(u)
    });
    let workload = common::sim::workload(Link::Direct);
    let spawn = |ops: &str| {
        let mut cmd = c.command(std::path::Path::new("unshare"));
        cmd.args(["--pid", "--fork", "--mount-proc", "--kill-child"])
            .arg(&workload)
            .args(ops.split_whitespace());
        common::sim::spawn_command_ready(cmd, ops)
    };
    let a = spawn("dev 0 alloc 600 ready hold");
    let b = spawn("dev 0 alloc-until-oom 100 ready hold");
    // B's refused allocation made it look for dead processes: A stays.
    let allocs: Vec<&String> = b.seen.iter().filter(|l| l.starts_with("allocs ")).collect();
    assert_eq!(
        allocs,
        ["allocs 4 CUDA_ERROR_OUT_OF_MEMORY"],
        "{:?}",
        b.seen
    );
    let usage = c.usage();
    let slots: Vec<_> = usage.slots.iter().filter(|s| s.used[0] > 0).collect();
    assert_eq!(slots.len(), 2, "{slots:?}");
    assert!(slots.iter().all(|s| s.pid == 1), "{slots:?}");
    assert_ne!(slots[0].ns_tag, slots[1].ns_tag, "{slots:?}");
    assert_eq!(
        slots.iter().map(|s| s.used[0]).sum::<u64>(),
        1000 * MIB,
        "{slots:?}"
    );
    drop((a, b));
}
