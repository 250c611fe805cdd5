//! Privileged tests of the eBPF observer: a child process moved into a
//! fresh cgroup v2 directory issues ioctls on a watched stand-in device
//! (`/dev/zero`) and on an unwatched one (`/dev/null`); the counts for that
//! cgroup must be exact.
//!
//! They need root and the built object (`$TESSERA_ARTIFACTS/ebpf/
//! tessera.bpf.o`, as `cargo xtask test` sets it) and say `skipped: <why>`
//! otherwise. The child is this test binary run again with
//! `TESSERA_EBPF_CHILD` set: the same test function then acts as the child.
#![allow(
    clippy::unwrap_used,
    reason = "test code unwraps; clippy only exempts #[test] functions themselves"
)]

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use tessera_agent::ebpf::{
    AttachMode, Device, DeviceSpec, ModeRequest, Observer, ObserverConfig, cgroup,
    mode::{self, KernelFacts},
};
use tessera_ebpf_common::{dev::kdev, ioctl::flags};

const CHILD_ENV: &str = "TESSERA_EBPF_CHILD";
/// ioctls on the watched device, with a plain command.
const N_PLAIN: u32 = 37;
/// ioctls on the watched device, wrapped in NV_ESC_IOCTL_XFER_CMD.
const N_XFER: u32 = 5;
/// ioctls on the unwatched device.
const M_UNWATCHED: u32 = 23;
/// `_IOWR('F', 0x2A, 32)`: RM_CONTROL's encoding.
const RM_CONTROL: u64 = 0xC020_462A;
/// `_IOWR('F', 0xD3, 16)`: NV_ESC_IOCTL_XFER_CMD.
const XFER: u64 = 0xC010_46D3;
/// The escape carried inside the XFER calls (RM_ALLOC).
const XFER_INNER: u32 = 0x2B;

/// The raw ioctl the child issues; the only unsafe code here.
mod sys {
    /// `nv_ioctl_xfer_t`.
    #[repr(C)]
    pub struct Xfer {
        pub cmd: u32,
        pub size: u32,
        pub ptr: u64,
    }

    /// ioctl(fd, cmd, arg) on a device that rejects it (`/dev/zero`,
    /// `/dev/null` answer ENOTTY); the result is irrelevant.
    pub fn ioctl<T>(fd: &std::fs::File, cmd: u64, arg: &mut T) {
        use std::os::fd::AsRawFd;
        // SAFETY: `fd` is an open file and `arg` a live, writable value of
        // at least the size encoded in `cmd`; the memory drivers never
        // write through it anyway.
        unsafe { libc::ioctl(fd.as_raw_fd(), cmd as _, std::ptr::from_mut(arg)) };
    }
}

/// Runs the child side and exits, when this process is the child.
fn child_side() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    // Wait until the parent has moved this process into the cgroup.
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "go");
    let zero = std::fs::File::open("/dev/zero").unwrap();
    let null = std::fs::File::open("/dev/null").unwrap();
    let mut params = [0u8; 48];
    for _ in 0..N_PLAIN {
        sys::ioctl(&zero, RM_CONTROL, &mut params);
    }
    for _ in 0..N_XFER {
        let mut xfer = sys::Xfer {
            cmd: XFER_INNER,
            size: 48,
            ptr: params.as_ptr() as u64,
        };
        sys::ioctl(&zero, XFER, &mut xfer);
    }
    for _ in 0..M_UNWATCHED {
        sys::ioctl(&null, RM_CONTROL, &mut params);
    }
    std::process::exit(0);
}

/// Why this machine cannot run the test, if it cannot.
fn skip_reason() -> Option<String> {
    // /proc/self belongs to the effective uid.
    let euid = std::fs::metadata("/proc/self")
        .map(|m| m.uid())
        .unwrap_or(u32::MAX);
    if euid != 0 {
        return Some("not root".into());
    }
    if let Err(why) = object() {
        return Some(why);
    }
    if let Err(e) = cgroup::cgroup2_root() {
        return Some(e.to_string());
    }
    None
}

fn object() -> Result<PathBuf, String> {
    let dir = std::env::var_os("TESSERA_ARTIFACTS")
        .ok_or("TESSERA_ARTIFACTS is not set (run `cargo xtask test`)")?;
    let object = Path::new(&dir).join("ebpf/tessera.bpf.o");
    if object.is_file() {
        Ok(object)
    } else {
        Err(format!(
            "{} does not exist (run `cargo xtask build`)",
            object.display()
        ))
    }
}

/// A fresh cgroup v2 directory, removed on drop.
struct TestCgroup(PathBuf);

impl TestCgroup {
    fn new(name: &str) -> Self {
        let root = cgroup::cgroup2_root().unwrap();
        let dir = root.join(format!("tessera-test-{}-{name}", std::process::id()));
        std::fs::create_dir(&dir).unwrap();
        Self(dir)
    }

    fn id(&self) -> u64 {
        cgroup::cgroup_id(&self.0).unwrap()
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        for _ in 0..50 {
            if std::fs::remove_dir(&self.0).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        eprintln!("warning: cannot remove test cgroup {}", self.0.display());
    }
}

/// Runs this test again as the child, inside `cgroup`.
fn run_child(test_name: &str, cgroup: &TestCgroup) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([test_name, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::fs::write(cgroup.0.join("cgroup.procs"), child.id().to_string()).unwrap();
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let out = child.wait_with_output().unwrap();
    let mut stderr = String::new();
    for line in BufReader::new(&out.stderr[..]).lines() {
        stderr.push_str(&line.unwrap());
        stderr.push('\n');
    }
    assert!(
        out.status.success(),
        "child failed: {}\n{stderr}",
        out.status
    );
}

/// The whole scenario in one attach mode; returns the mode chosen.
fn exact_counts(test_name: &str, request: ModeRequest) -> Option<AttachMode> {
    if let Some(why) = skip_reason() {
        eprintln!("skipped: {why}");
        return None;
    }
    let zero: Device = DeviceSpec::path("/dev/zero").resolve().unwrap();
    let null: Device = DeviceSpec::path("/dev/null").resolve().unwrap();
    let cgroup = TestCgroup::new(test_name);
    let mut config = ObserverConfig::new(object().unwrap(), vec![zero.clone()]);
    config.mode = request;
    let mut observer = Observer::start(&config).unwrap();
    observer.audit_opens(&cgroup.0).unwrap();

    run_child(test_name, &cgroup);

    let snap = observer.snapshot().unwrap();
    let id = cgroup.id();
    let (zero_dev, null_dev) = (kdev(1, 5), kdev(1, 3));
    assert_eq!(zero.kdev(), zero_dev);
    assert_eq!(null.kdev(), null_dev);
    let mine: Vec<_> = snap
        .ioctls
        .iter()
        .filter(|(k, _)| k.cgroup_id == id)
        .collect();
    assert_eq!(
        snap.ioctls_nr(id, zero_dev, 0x2A, 0),
        u64::from(N_PLAIN),
        "plain ioctls on /dev/zero: {mine:?}"
    );
    assert_eq!(
        snap.ioctls_nr(id, zero_dev, XFER_INNER, flags::XFER),
        u64::from(N_XFER),
        "xfer ioctls on /dev/zero: {mine:?}"
    );
    assert_eq!(
        snap.ioctls_on(id, zero_dev),
        u64::from(N_PLAIN + N_XFER),
        "{mine:?}"
    );
    assert_eq!(snap.ioctls_on(id, null_dev), 0, "{mine:?}");
    assert_eq!(mine.len(), 2, "only the two keys for /dev/zero: {mine:?}");
    let opens: Vec<_> = snap
        .opens
        .iter()
        .filter(|(k, _)| k.cgroup_id == id)
        .collect();
    assert_eq!(snap.opens_of(id, zero_dev), 1, "{opens:?}");
    assert_eq!(snap.opens_of(id, null_dev), 0, "{opens:?}");
    assert!(snap.stats.ioctls_counted >= u64::from(N_PLAIN + N_XFER));
    Some(observer.mode())
}

#[test]
fn tracepoint_counts_exactly_per_cgroup_and_device() {
    child_side();
    let name = "tracepoint_counts_exactly_per_cgroup_and_device";
    if let Some(mode) = exact_counts(name, ModeRequest::Only(AttachMode::Tracepoint)) {
        assert_eq!(mode, AttachMode::Tracepoint);
    }
}

#[test]
fn raw_tracepoint_counts_exactly_per_cgroup_and_device() {
    child_side();
    let name = "raw_tracepoint_counts_exactly_per_cgroup_and_device";
    if let Some(mode) = exact_counts(name, ModeRequest::Only(AttachMode::RawTracepoint)) {
        assert_eq!(mode, AttachMode::RawTracepoint);
    }
}

#[test]
fn auto_mode_picks_the_first_workable_mode() {
    child_side();
    let name = "auto_mode_picks_the_first_workable_mode";
    let facts = KernelFacts::probe();
    if let Some(chosen) = exact_counts(name, ModeRequest::Auto) {
        let plan = mode::plan(ModeRequest::Auto, &facts);
        // Without nvidia.ko the kprobe is skipped; the next one must work.
        if !facts.nvidia_ioctl {
            assert_eq!(chosen, plan.candidates[0]);
            assert_ne!(chosen, AttachMode::Kprobe);
        }
    }
}

#[test]
fn explicit_kprobe_mode_fails_with_the_reason_without_the_driver() {
    child_side();
    if let Some(why) = skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    if KernelFacts::probe().nvidia_ioctl {
        eprintln!("skipped: nvidia.ko is loaded, so the kprobe can attach");
        return;
    }
    let mut config = ObserverConfig::new(object().unwrap(), Vec::new());
    config.mode = ModeRequest::Only(AttachMode::Kprobe);
    let err = Observer::start(&config).unwrap_err().to_string();
    assert!(
        err.starts_with("cannot attach the ebpf ioctl observer in any mode (kprobe: "),
        "{err}"
    );
}
