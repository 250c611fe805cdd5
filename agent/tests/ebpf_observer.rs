//! Privileged tests of the eBPF observer: a child process moved into a
//! fresh cgroup v2 directory issues ioctls on a watched stand-in device
//! (`/dev/zero`) and on an unwatched one (`/dev/null`); the counts for that
//! cgroup must be exact.
//!
//! They need root and the built object (`$TESSERA_ARTIFACTS/ebpf/
//! tessera.bpf.o`, as `cargo xtask test` sets it) and say `skipped: <why>`
//! otherwise. The child is this test binary run again (see
//! `ebpf_support`).
#![allow(
    clippy::unwrap_used,
    reason = "test code unwraps; clippy only exempts #[test] functions themselves"
)]

#[path = "ebpf_support/mod.rs"]
mod support;

use support::{Child, TestCgroup, child_role, device, object, skip_if, skip_reason, sys};
use tessera_agent::ebpf::{
    AttachMode, ModeRequest, Observer, ObserverConfig,
    mode::{self, KernelFacts},
};
use tessera_ebpf_common::{
    dev::kdev,
    ioctl::{NV_ESC_IOCTL_XFER_CMD, Xfer, flags},
    rm::{NV_ESC_RM_ALLOC, NV_ESC_RM_CONTROL},
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

/// Runs the child side and exits, when this process is the child.
fn child_side() {
    if child_role().is_none() {
        return;
    }
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
    std::process::exit(0);
}

/// Runs this test again as the child, inside `cgroup`.
fn run_child(test_name: &str, cgroup: &TestCgroup) {
    Child::spawn(test_name, "ioctls").join(&cgroup.0).go();
}

/// The whole scenario in one attach mode; returns the mode chosen.
fn exact_counts(test_name: &str, request: ModeRequest) -> Option<AttachMode> {
    skip_if!(skip_reason(), None);
    let zero = device("/dev/zero");
    let null = device("/dev/null");
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
