//! Privileged tests of the eBPF observer: a child process moved into a
//! fresh cgroup v2 directory issues ioctls on a watched stand-in device
//! (`/dev/zero`) and on an unwatched one (`/dev/null`); the counts for that
//! cgroup must be exact, also when the child tries to hide watched ioctls
//! behind the verdict cache; auto mode must pick the mode the kernel
//! allows, judged from what the test reads of the kernel itself.
//!
//! They need root and the built object (`$TESSERA_ARTIFACTS/ebpf/
//! tessera.bpf.o`, as `cargo xtask test` sets it) and say `skipped: <why>`
//! otherwise. The child is this test binary run again (see
//! `ebpf_support`).
#![allow(
    clippy::unwrap_used,
    reason = "test code unwraps; clippy only exempts #[test] functions themselves"
)]

mod ebpf_support;
use ebpf_support as support;

use support::{
    Child, TestCgroup, answer, child_role, device, object, skip_if, skip_reason, sys, wait_line,
};
use tessera_agent::ebpf::{
    AttachMode, ModeRequest, Observer, ObserverConfig,
    mode::{self, KernelFacts},
};
use tessera_ebpf_common::{
    dev::{kdev, kdev_major, kdev_minor},
    ioctl::{NV_ESC_IOCTL_XFER_CMD, Xfer, flags},
    rm::{NV_ESC_RM_ALLOC, NV_ESC_RM_CONTROL},
    verdict::dev_slot,
};

/// ioctls on the watched device, with a plain command.
const N_PLAIN: u32 = 37;
/// ioctls on the watched device, wrapped in NV_ESC_IOCTL_XFER_CMD.
const N_XFER: u32 = 5;
/// ioctls on the unwatched device.
const M_UNWATCHED: u32 = 23;
/// RM_CONTROL's encoding.
const RM_CONTROL: u64 = sys::iowr(NV_ESC_RM_CONTROL, 32);
/// NV_ESC_IOCTL_XFER_CMD's.
const XFER: u64 = sys::iowr(NV_ESC_IOCTL_XFER_CMD, size_of::<Xfer>());
/// The escape carried inside the XFER calls.
const XFER_INNER: u32 = NV_ESC_RM_ALLOC;

/// Rounds of "ioctl on a fresh /dev/null, close, ioctl on a fresh
/// /dev/zero" (the zero file is likely to reuse the null file's memory).
const K_REUSE: u32 = 300;
/// ioctls on a /dev/null fd, which the verdict cache then answers.
const N_CACHED: u32 = 50;
/// ioctls on a /dev/null fd number after /dev/zero was dup2'ed over it.
const M_DUP: u32 = 17;

/// Runs the child side and exits, when this process is the child.
fn child_side() {
    match child_role().as_deref() {
        None => return,
        Some("reuse") => reuse_child(),
        Some("two-phase") => two_phase_child(),
        Some("watch-later") => watch_later_child(),
        Some("collide") => collide_child(),
        Some(_) => ioctls_child(),
    }
    std::process::exit(0);
}

/// The child of [`exact_counts`].
fn ioctls_child() {
    let zero = std::fs::File::open("/dev/zero").unwrap();
    let null = std::fs::File::open("/dev/null").unwrap();
    let mut params = [0u8; 48];
    for _ in 0..N_PLAIN {
        sys::ioctl(&zero, RM_CONTROL, &mut params);
    }
    for _ in 0..N_XFER {
        let mut xfer = Xfer {
            cmd: XFER_INNER,
            size: 48,
            ptr: params.as_ptr() as u64,
        };
        sys::ioctl(&zero, XFER, &mut xfer);
    }
    for _ in 0..M_UNWATCHED {
        sys::ioctl(&null, RM_CONTROL, &mut params);
    }
}

/// The child of [`cache_cannot_hide`]: tries to make ioctls on the watched
/// device look like ones on a file the verdict cache knows is not watched.
fn reuse_child() {
    let mut params = [0u8; 48];
    // A cached "not watched" file.
    let null = std::fs::File::open("/dev/null").unwrap();
    for _ in 0..N_CACHED {
        sys::ioctl(&null, RM_CONTROL, &mut params);
    }
    // dup2 of the watched device over the cached fd number.
    let zero = std::fs::File::open("/dev/zero").unwrap();
    let mut over: std::os::fd::OwnedFd = null.into();
    rustix::io::dup2(&zero, &mut over).unwrap();
    let over = std::fs::File::from(over);
    for _ in 0..M_DUP {
        sys::ioctl(&over, RM_CONTROL, &mut params);
    }
    drop((over, zero));
    // Closing a cached file and opening the watched device, which the
    // allocator likely places at the same address.
    for _ in 0..K_REUSE {
        let null = std::fs::File::open("/dev/null").unwrap();
        sys::ioctl(&null, RM_CONTROL, &mut params);
        sys::ioctl(&null, RM_CONTROL, &mut params);
        drop(null);
        let zero = std::fs::File::open("/dev/zero").unwrap();
        sys::ioctl(&zero, RM_CONTROL, &mut params);
    }
}

/// Runs this test again as the child in `role`, inside `cgroup`.
fn run_child(test_name: &str, role: &str, cgroup: &TestCgroup) {
    Child::spawn(test_name, role).join(&cgroup.0).go();
}

/// The whole scenario in one attach mode; returns the mode chosen.
fn exact_counts(test_name: &str, request: ModeRequest) -> Option<AttachMode> {
    exact_counts_with(test_name, request, false)
}

/// [`exact_counts`], with the `*_probe` build if `probe_reads`.
fn exact_counts_with(
    test_name: &str,
    request: ModeRequest,
    probe_reads: bool,
) -> Option<AttachMode> {
    skip_if!(skip_reason(), None);
    let zero = device("/dev/zero");
    let null = device("/dev/null");
    let cgroup = TestCgroup::new(test_name);
    let mut config = ObserverConfig::new(object().unwrap(), vec![zero.clone()]);
    config.mode = request;
    config.probe_reads = probe_reads;
    let mut observer = Observer::start(&config).unwrap();
    observer.audit_opens(&cgroup.0).unwrap();

    run_child(test_name, "ioctls", &cgroup);

    let snap = observer.snapshot().unwrap();
    let id = cgroup.id();
    let (zero_dev, null_dev) = (kdev(1, 5), kdev(1, 3));
    assert_eq!(zero.kdev(), zero_dev);
    assert_eq!(null.kdev(), null_dev);
    let mine = snap.ioctls_of(id);
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
    assert!(snap.ioctls_counted() >= u64::from(N_PLAIN + N_XFER));
    // The walk with plain loads wherever the kernel's BTF has the kfunc
    // (read here from the BTF's string table).
    let btf = std::fs::read("/sys/kernel/btf/vmlinux").unwrap();
    let has_cast = btf.windows(17).any(|w| w == b"\0bpf_rdonly_cast\0");
    let mode = observer.mode();
    let expected = if has_cast && !probe_reads {
        mode.program()
    } else {
        mode.probe_program()
    };
    assert_eq!(
        observer.ioctl_program(),
        expected,
        "has bpf_rdonly_cast: {has_cast}"
    );
    Some(mode)
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
fn tracepoint_probe_build_counts_exactly_per_cgroup_and_device() {
    child_side();
    let name = "tracepoint_probe_build_counts_exactly_per_cgroup_and_device";
    let request = ModeRequest::Only(AttachMode::Tracepoint);
    if let Some(mode) = exact_counts_with(name, request, true) {
        assert_eq!(mode, AttachMode::Tracepoint);
    }
}

#[test]
fn raw_tracepoint_probe_build_counts_exactly_per_cgroup_and_device() {
    child_side();
    let name = "raw_tracepoint_probe_build_counts_exactly_per_cgroup_and_device";
    let request = ModeRequest::Only(AttachMode::RawTracepoint);
    if let Some(mode) = exact_counts_with(name, request, true) {
        assert_eq!(mode, AttachMode::RawTracepoint);
    }
}

/// The verdict cache answers repeated ioctls on an unwatched file, yet
/// neither a watched device dup2'ed over a cached fd number nor one opened
/// where a cached file was freed escapes the count.
fn cache_cannot_hide(test_name: &str, mode: AttachMode) {
    skip_if!(skip_reason());
    let zero = device("/dev/zero");
    let cgroup = TestCgroup::new(test_name);
    let mut config = ObserverConfig::new(object().unwrap(), vec![zero.clone()]);
    config.mode = ModeRequest::Only(mode);
    let observer = Observer::start(&config).unwrap();
    let before = observer.stats().unwrap().verdicts_cached;

    run_child(test_name, "reuse", &cgroup);

    let snap = observer.snapshot().unwrap();
    let id = cgroup.id();
    let mine = snap.ioctls_of(id);
    assert_eq!(
        snap.ioctls_on(id, zero.kdev()),
        u64::from(M_DUP + K_REUSE),
        "{mine:?}"
    );
    assert_eq!(snap.ioctls_on(id, kdev(1, 3)), 0, "{mine:?}");
    // The repeated ioctls on one /dev/null file were answered from the
    // cache (other processes' ioctls can only add to this).
    let cached = snap.stats.verdicts_cached - before;
    assert!(
        cached >= u64::from(N_CACHED - 1 + K_REUSE),
        "only {cached} cached verdicts"
    );
}

#[test]
fn tracepoint_verdict_cache_cannot_hide_a_watched_device() {
    child_side();
    let name = "tracepoint_verdict_cache_cannot_hide_a_watched_device";
    cache_cannot_hide(name, AttachMode::Tracepoint);
}

#[test]
fn raw_tracepoint_verdict_cache_cannot_hide_a_watched_device() {
    child_side();
    let name = "raw_tracepoint_verdict_cache_cannot_hide_a_watched_device";
    cache_cannot_hide(name, AttachMode::RawTracepoint);
}

/// ioctls on the watched device, pausing for the parent in between.
fn two_phase_child() {
    let zero = std::fs::File::open("/dev/zero").unwrap();
    let mut params = [0u8; 48];
    for _ in 0..N_CACHED {
        sys::ioctl(&zero, RM_CONTROL, &mut params);
    }
    answer("paused");
    wait_line("exit");
    sys::ioctl(&zero, RM_CONTROL, &mut params);
}

/// The bypass check caches, per cgroup, that the cgroup is outside every
/// watched one; watching it later must void that, so the process's next
/// ioctl is reported.
fn watching_later_is_seen(test_name: &str, mode: AttachMode) {
    skip_if!(skip_reason());
    let pod = TestCgroup::new(test_name);
    let mut config = ObserverConfig::new(object().unwrap(), vec![device("/dev/zero")]);
    config.mode = ModeRequest::Only(mode);
    let mut observer = Observer::start(&config).unwrap();
    let mut events = observer.bypass_events().unwrap();
    let mut child = Child::spawn(test_name, "two-phase").join(&pod.0);
    let pid = child.pid();
    assert_eq!(child.go_until_answer(), "paused");
    assert!(
        events.drain().iter().all(|e| e.tgid != pid),
        "reported while outside every watched cgroup"
    );
    observer.watch_cgroup(pod.id()).unwrap();
    child.finish();
    let mut ours = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
    while ours.is_empty() && std::time::Instant::now() < deadline {
        events.wait(std::time::Duration::from_millis(50)).unwrap();
        ours.extend(events.drain().into_iter().filter(|e| e.tgid == pid));
    }
    assert_eq!(ours.len(), 1, "{ours:?}");
    assert_eq!(ours[0].watched_cgroup_id, pod.id());
}

#[test]
fn tracepoint_watching_a_cgroup_voids_its_cached_verdict() {
    child_side();
    let name = "tracepoint_watching_a_cgroup_voids_its_cached_verdict";
    watching_later_is_seen(name, AttachMode::Tracepoint);
}

#[test]
fn raw_tracepoint_watching_a_cgroup_voids_its_cached_verdict() {
    child_side();
    let name = "raw_tracepoint_watching_a_cgroup_voids_its_cached_verdict";
    watching_later_is_seen(name, AttachMode::RawTracepoint);
}

/// ioctls on a device the child holds open, before and after the parent
/// changes the watched devices.
const N_BEFORE: u32 = 40;
const M_AFTER: u32 = 29;
/// Rounds of "ioctl on one pty, then on another whose device number
/// shares its cache slot".
const K_COLLIDE: u32 = 200;

/// Pins a child to CPU 0, so its ioctls meet the per-CPU cache entries
/// its earlier ioctls left (util-linux's `taskset`).
const ON_CPU0: [&str; 3] = ["taskset", "-c", "0"];

/// The child of [`watching_a_device_later_is_seen`].
fn watch_later_child() {
    let null = std::fs::File::open("/dev/null").unwrap();
    let mut params = [0u8; 48];
    for _ in 0..N_BEFORE {
        sys::ioctl(&null, RM_CONTROL, &mut params);
    }
    answer("cached");
    wait_line("exit");
    for _ in 0..M_AFTER {
        sys::ioctl(&null, RM_CONTROL, &mut params);
    }
}

/// The device cache remembers that /dev/null is not watched; once the
/// agent watches it, the same open file's next ioctls count, exactly.
fn watching_a_device_later_is_seen(test_name: &str, mode: AttachMode) {
    skip_if!(skip_reason());
    let (zero, null) = (device("/dev/zero"), device("/dev/null"));
    let cgroup = TestCgroup::new(test_name);
    let mut config = ObserverConfig::new(object().unwrap(), vec![zero.clone()]);
    config.mode = ModeRequest::Only(mode);
    let mut observer = Observer::start(&config).unwrap();
    let before = observer.stats().unwrap().verdicts_cached;
    let mut child = Child::spawn_wrapped(&ON_CPU0, test_name, "watch-later", &[]).join(&cgroup.0);
    assert_eq!(child.go_until_answer(), "cached");
    let id = cgroup.id();
    assert_eq!(observer.snapshot().unwrap().ioctls_on(id, null.kdev()), 0);
    let cached = observer.stats().unwrap().verdicts_cached - before;
    assert!(
        cached >= u64::from(N_BEFORE - 1),
        "only {cached} cached verdicts"
    );
    observer.set_devices(&[zero, null.clone()]).unwrap();
    child.finish();
    let snap = observer.snapshot().unwrap();
    assert_eq!(
        snap.ioctls_on(id, null.kdev()),
        u64::from(M_AFTER),
        "{:?}",
        snap.ioctls_of(id)
    );
}

#[test]
fn tracepoint_watching_a_device_later_voids_its_cached_verdict() {
    child_side();
    let name = "tracepoint_watching_a_device_later_voids_its_cached_verdict";
    watching_a_device_later_is_seen(name, AttachMode::Tracepoint);
}

#[test]
fn raw_tracepoint_watching_a_device_later_voids_its_cached_verdict() {
    child_side();
    let name = "raw_tracepoint_watching_a_device_later_voids_its_cached_verdict";
    watching_a_device_later_is_seen(name, AttachMode::RawTracepoint);
}

/// `TIOCGPTN` and `TIOCSPTLCK`: a pty master's slave number, and its lock.
const TIOCGPTN: u64 = 0x8004_5430;
const TIOCSPTLCK: u64 = 0x4004_5431;

/// Opens ptys until two slaves' device numbers share a slot of the device
/// cache (the slots are few, so that comes soon); answers both numbers
/// (`major:minor major:minor`), then issues ioctls on both in turn.
fn collide_child() {
    let mut open = Vec::new();
    let mut by_slot = std::collections::BTreeMap::new();
    let (watched, other) = loop {
        assert!(open.len() < 1024, "no two pty slaves share a cache slot");
        let master = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/ptmx")
            .unwrap();
        let mut unlock = 0u32;
        sys::ioctl(&master, TIOCSPTLCK, &mut unlock);
        let mut n = u32::MAX;
        sys::ioctl(&master, TIOCGPTN, &mut n);
        assert_ne!(n, u32::MAX, "TIOCGPTN failed");
        let slave = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/dev/pts/{n}"))
            .unwrap();
        let rdev = device(&format!("/dev/pts/{n}")).kdev();
        open.push(master);
        if let Some(earlier) = by_slot.insert(dev_slot(rdev), (rdev, slave)) {
            let (_, slave) = by_slot.remove(&dev_slot(rdev)).unwrap();
            break (earlier, (rdev, slave));
        }
    };
    let spec = |rdev: u32| format!("{}:{}", kdev_major(rdev), kdev_minor(rdev));
    answer(&format!("{} {}", spec(watched.0), spec(other.0)));
    wait_line("exit");
    let mut params = [0u8; 48];
    for _ in 0..K_COLLIDE {
        sys::ioctl(&other.1, RM_CONTROL, &mut params);
        sys::ioctl(&watched.1, RM_CONTROL, &mut params);
    }
}

/// Two devices that share a slot of the device cache are told apart: the
/// watched one counts every time, the other never.
fn colliding_devices_are_told_apart(test_name: &str, mode: AttachMode) {
    skip_if!(skip_reason());
    let cgroup = TestCgroup::new(test_name);
    let mut config = ObserverConfig::new(object().unwrap(), vec![device("/dev/zero")]);
    config.mode = ModeRequest::Only(mode);
    let mut observer = Observer::start(&config).unwrap();
    let mut child = Child::spawn_wrapped(&ON_CPU0, test_name, "collide", &[]).join(&cgroup.0);
    let answer = child.go_until_answer();
    let (watched, other) = answer.split_once(' ').unwrap();
    let (watched, other) = (device(watched), device(other));
    assert_eq!(dev_slot(watched.kdev()), dev_slot(other.kdev()));
    assert_ne!(watched.kdev(), other.kdev());
    observer
        .set_devices(std::slice::from_ref(&watched))
        .unwrap();
    child.finish();
    let snap = observer.snapshot().unwrap();
    let id = cgroup.id();
    let mine = snap.ioctls_of(id);
    assert_eq!(
        snap.ioctls_on(id, watched.kdev()),
        u64::from(K_COLLIDE),
        "{mine:?}"
    );
    assert_eq!(snap.ioctls_on(id, other.kdev()), 0, "{mine:?}");
}

#[test]
fn tracepoint_devices_sharing_a_cache_slot_are_told_apart() {
    child_side();
    let name = "tracepoint_devices_sharing_a_cache_slot_are_told_apart";
    colliding_devices_are_told_apart(name, AttachMode::Tracepoint);
}

#[test]
fn raw_tracepoint_devices_sharing_a_cache_slot_are_told_apart() {
    child_side();
    let name = "raw_tracepoint_devices_sharing_a_cache_slot_are_told_apart";
    colliding_devices_are_told_apart(name, AttachMode::RawTracepoint);
}

/// What this test reads of the kernel itself, independently of
/// `KernelFacts`: the kprobe PMU, and the NVIDIA ioctl entry points in
/// `/proc/kallsyms` (`nvidia.ko`, `nvidia-uvm.ko` loaded).
struct Seen {
    kprobes: bool,
    nvidia_ioctl: bool,
    uvm_ioctl: bool,
}

impl Seen {
    fn read() -> Self {
        let kallsyms = std::fs::read_to_string("/proc/kallsyms").unwrap();
        let has = |name: &str| {
            kallsyms
                .lines()
                .any(|l| l.split_whitespace().nth(2) == Some(name))
        };
        Self {
            kprobes: std::path::Path::new("/sys/bus/event_source/devices/kprobe/type").exists(),
            nvidia_ioctl: has(mode::NVIDIA_IOCTL_FN),
            uvm_ioctl: has(mode::UVM_IOCTL_FN),
        }
    }
}

/// Whether an observer starts in exactly `mode` here.
fn starts_in(mode: AttachMode) -> bool {
    let mut config = ObserverConfig::new(object().unwrap(), vec![device("/dev/zero")]);
    config.mode = ModeRequest::Only(mode);
    Observer::start(&config).is_ok()
}

#[test]
fn auto_mode_picks_the_mode_the_kernel_allows() {
    child_side();
    skip_if!(skip_reason());
    let seen = Seen::read();
    let facts = KernelFacts::probe();
    assert_eq!(
        (facts.kprobes, facts.nvidia_ioctl, facts.uvm_ioctl),
        (seen.kprobes, seen.nvidia_ioctl, seen.uvm_ioctl),
        "the probe misreads the kernel"
    );
    // The kprobe first, where the driver is loaded and a kprobe attaches;
    // else the syscall tracepoint, else the raw tracepoint.
    let expected = if seen.kprobes && seen.nvidia_ioctl && starts_in(AttachMode::Kprobe) {
        AttachMode::Kprobe
    } else if starts_in(AttachMode::Tracepoint) {
        AttachMode::Tracepoint
    } else {
        AttachMode::RawTracepoint
    };
    let plan = mode::plan(ModeRequest::Auto, &facts);
    let kprobe_skip = plan.skipped.iter().find(|(m, _)| *m == AttachMode::Kprobe);
    match (seen.kprobes, seen.nvidia_ioctl) {
        (false, _) => assert!(
            kprobe_skip.is_some_and(|(_, why)| why.starts_with("no kprobe support")),
            "{plan:?}"
        ),
        (true, false) => assert!(
            kprobe_skip.is_some_and(|(_, why)| why.contains("nvidia.ko not loaded")),
            "{plan:?}"
        ),
        (true, true) => assert_eq!(plan.candidates[0], AttachMode::Kprobe, "{plan:?}"),
    }
    if expected == AttachMode::Kprobe {
        // Stand-in devices never reach the driver's handler: only the
        // choice can be checked here.
        let config = ObserverConfig::new(object().unwrap(), vec![device("/dev/zero")]);
        assert_eq!(Observer::start(&config).unwrap().mode(), AttachMode::Kprobe);
    } else {
        let name = "auto_mode_picks_the_mode_the_kernel_allows";
        assert_eq!(exact_counts(name, ModeRequest::Auto), Some(expected));
    }
}

#[test]
fn explicit_kprobe_mode_fails_with_the_reason_without_the_driver() {
    child_side();
    skip_if!(skip_reason());
    skip_if!(
        KernelFacts::probe()
            .nvidia_ioctl
            .then_some("nvidia.ko is loaded, so the kprobe can attach")
    );
    let mut config = ObserverConfig::new(object().unwrap(), Vec::new());
    config.mode = ModeRequest::Only(AttachMode::Kprobe);
    let err = Observer::start(&config).unwrap_err().to_string();
    assert!(
        err.starts_with("cannot attach the ebpf ioctl observer in any mode (kprobe: "),
        "{err}"
    );
}
