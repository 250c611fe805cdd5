//! The simulator's driver calls reach the kernel as real ioctls on the
//! stand-in devices, with NVIDIA's command numbers and sizes (seen with
//! strace, as any kernel-side observer would see them).

use tessera_testkit::sim as support;

use std::process::Command;

use support::{Link, Node, NodeSpec, workload};

/// One traced ioctl: device path, `_IOC_NR`, `_IOC_SIZE` (or the raw
/// command for non-`_IOC` numbers).
#[derive(Debug, PartialEq, Eq)]
struct Ioctl {
    device: String,
    nr: u32,
    size: u32,
}

fn strace_available() -> bool {
    Command::new("strace").arg("-V").output().is_ok()
}

/// Runs the workload under strace and returns its ioctls on `/dev/null`
/// and `/dev/zero` (the stand-ins), in order.
fn traced(node: &Node, ops: &str) -> Vec<Ioctl> {
    let log = node.dir.path().join("strace.log");
    let out = node
        .command(std::path::Path::new("strace"))
        .args(["-f", "-qq", "-e", "trace=ioctl", "-y", "-o"])
        .arg(&log)
        .arg(workload(Link::Direct))
        .args(ops.split_whitespace())
        .output()
        .expect("run strace");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&log).expect("read strace log");
    text.lines()
        .filter_map(|l| {
            let rest = &l[l.find("ioctl(")? + 6..];
            let dev = &rest[rest.find('<')? + 1..rest.find('>')?];
            if dev != "/dev/null" && dev != "/dev/zero" {
                return None;
            }
            // `_IOC(_IOC_READ|_IOC_WRITE, 0x46, 0x2b, 0x30)` or a raw number.
            let cmd = &rest[rest.find(", ")? + 2..];
            let (nr, size) = if let Some(ioc) = cmd.strip_prefix("_IOC(") {
                let f: Vec<&str> = ioc.split(", ").collect();
                let hex = |s: &str| {
                    u32::from_str_radix(s.trim_end_matches(')').trim_start_matches("0x"), 16)
                };
                (hex(f[2]).ok()?, hex(f[3].split(')').next()?).ok()?)
            } else {
                let raw = cmd.split(',').next()?;
                (
                    u32::from_str_radix(raw.trim_start_matches("0x"), 16).ok()?,
                    0,
                )
            };
            Some(Ioctl {
                device: dev.to_string(),
                nr,
                size,
            })
        })
        .collect()
}

fn io(device: &str, nr: u32, size: u32) -> Ioctl {
    Ioctl {
        device: device.into(),
        nr,
        size,
    }
}

#[test]
fn driver_calls_issue_the_real_escapes() {
    if !strace_available() {
        println!("skipped: strace is not installed (`cargo xtask setup` installs it)");
        return;
    }
    let node = Node::small();
    let seen = traced(
        &node,
        "dev 0 alloc 1 alloc 2 launch spin 1 1 5 sync free-all",
    );
    assert_eq!(
        seen,
        [
            // cuInit: NV_ESC_CHECK_VERSION_STR, nv_ioctl_rm_api_version_t (72 bytes).
            io("/dev/null", 0xd2, 0x48),
            // First context on GPU 0: UVM_REGISTER_GPU (raw command 37).
            io("/dev/zero", 0x25, 0),
            // Two cuMemAlloc: NV_ESC_RM_ALLOC with NVOS64 (48 bytes, driver >= 535).
            io("/dev/null", 0x2b, 0x30),
            io("/dev/null", 0x2b, 0x30),
            // Launches and syncs issue none; two frees: NV_ESC_RM_FREE (NVOS00).
            io("/dev/null", 0x29, 0x10),
            io("/dev/null", 0x29, 0x10),
        ]
    );
}

#[test]
fn older_drivers_use_the_older_layout_and_xfer_wraps_escapes() {
    if !strace_available() {
        println!("skipped: strace is not installed (`cargo xtask setup` installs it)");
        return;
    }
    let old = NodeSpec::small().driver_version("530.30.02").build();
    let seen = traced(&old, "dev 0 alloc 1");
    assert_eq!(
        seen[2],
        io("/dev/null", 0x2b, 0x28),
        "NVOS64 was 40 bytes before 535"
    );

    let xfer = NodeSpec::small().ioctl_xfer().build();
    let seen = traced(&xfer, "dev 0 alloc 1 free-all");
    let control: Vec<&Ioctl> = seen.iter().filter(|i| i.device == "/dev/null").collect();
    assert_eq!(control.len(), 3);
    for i in control {
        // NV_ESC_IOCTL_XFER_CMD with nv_ioctl_xfer_t (16 bytes).
        assert_eq!((i.nr, i.size), (0xd3, 0x10), "{i:?}");
    }
}
