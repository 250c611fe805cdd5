//! Privileged tests of the per-pod device guard, with real devices as
//! stand-ins: 1:5 (`/dev/zero`) and 1:7 (`/dev/full`) play GPU minors,
//! 1:3 (`/dev/null`) the control node, and 1:8 (`/dev/random`) a device
//! the guard does not govern. The pod cgroup is a cgroupfs-style
//! `kubepods/besteffort/pod<uid>` inside a test cgroup, and the probing
//! process sits in a container cgroup below it.
//!
//! The guard is applied by a child process that exits before anything is
//! probed, so what is checked is the pinned guard alone. Skipped (with the
//! reason) without root or the objects.
#![allow(
    clippy::unwrap_used,
    reason = "test code unwraps; clippy only exempts #[test] functions themselves"
)]

mod ebpf_support;
use ebpf_support as support;

use std::path::{Path, PathBuf};

use rustix::mount::{UnmountFlags, unmount};
use support::{
    Child, TestCgroup, answer, answer_in, artifact, child_role, device, devices, skip_if,
    skip_reason,
};
use tessera_agent::cgroup;
use tessera_agent::ebpf::mounts::BPFFS;
use tessera_agent::ebpf::{GuardDevices, Guards};
use tessera_agent::mountinfo;

const GUARD_OBJECT: &str = "ebpf/tessera-guard.bpf.o";
const POD_ENV: &str = "TESSERA_TEST_GUARD_POD";
const PINS_ENV: &str = "TESSERA_TEST_GUARD_PINS";
const ALLOW_ENV: &str = "TESSERA_TEST_GUARD_ALLOW";
const CID: &str = "4f6c2b0e9a8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a291807f6e5d4c3b2a19080";
/// The devices probed, by name.
const PROBED: [&str; 4] = ["null", "zero", "full", "random"];

fn guards(pins: &Path) -> Guards {
    let object = artifact(GUARD_OBJECT).unwrap();
    let stand_ins = devices(&["control=/dev/null", "gpu=/dev/zero", "gpu=/dev/full"]);
    Guards::new(object, GuardDevices::from_devices(&stand_ins))
        .unwrap()
        .with_pin_dir(pins)
}

/// Children: `apply` guards the pod and exits (the loader going away);
/// `probe` opens each device and prints `name=ok|EPERM|<errno>`.
fn child_side() {
    let Some(role) = child_role() else { return };
    match role.as_str() {
        "apply" => {
            let pod = PathBuf::from(std::env::var(POD_ENV).unwrap());
            let pins = PathBuf::from(std::env::var(PINS_ENV).unwrap());
            let allowed: Vec<(u32, u32)> = std::env::var(ALLOW_ENV)
                .unwrap()
                .split(',')
                .filter(|s| !s.is_empty())
                .map(|s| {
                    let d = device(s);
                    (d.major, d.minor)
                })
                .collect();
            let info = guards(&pins).guard_pod(&pod, &allowed).unwrap();
            answer(&info.link_id.to_string());
        }
        "probe" => {
            let mut out = Vec::new();
            for name in PROBED {
                let result = match std::fs::File::open(format!("/dev/{name}")) {
                    Ok(_) => "ok".to_owned(),
                    Err(e) if e.raw_os_error() == Some(libc::EPERM) => "EPERM".to_owned(),
                    Err(e) => format!("{e}"),
                };
                out.push(format!("{name}={result}"));
            }
            answer(&out.join(" "));
        }
        "new-node" => {
            let pins = PathBuf::from(std::env::var(PINS_ENV).unwrap());
            answer(&race_on_a_new_node(&pins));
        }
        "prepare" => {
            let pins = PathBuf::from(std::env::var(PINS_ENV).unwrap());
            guards(&pins).ensure_pin_dir().unwrap();
            answer("ok");
        }
        other => panic!("unknown child role {other}"),
    }
    std::process::exit(0);
}

/// Processes racing to prepare their pin directories, and how many times.
const RACERS: usize = 16;
const ROUNDS: usize = 40;
const RACE_TEST: &str = "processes_preparing_pins_at_once_on_a_new_node_share_one_bpffs";

/// The bpf mounts at [`BPFFS`] in this mount namespace.
fn bpffs_mounts() -> usize {
    mountinfo::read()
        .unwrap()
        .iter()
        .filter(|m| m.fs_type == "bpf" && m.mount_point == Path::new(BPFFS))
        .count()
}

/// In a private mount namespace, [`ROUNDS`] times: unmounts bpffs as on
/// a new node and lets [`RACERS`] processes prepare pin directories below
/// `pins` at once. Tells how many bpf mounts there were then and how many
/// of the directories are on the one visible, for the first round that
/// did not end with one mount holding them all (or for all).
fn race_on_a_new_node(pins: &Path) -> String {
    for round in 0..ROUNDS {
        while bpffs_mounts() > 0 {
            unmount(BPFFS, UnmountFlags::DETACH).unwrap();
        }
        let mut racers: Vec<Child> = (0..RACERS)
            .map(|i| {
                let dir = pins.join(i.to_string());
                Child::spawn_with(RACE_TEST, "prepare", &[(PINS_ENV, dir.to_str().unwrap())])
            })
            .collect();
        for racer in &mut racers {
            racer.release();
        }
        for racer in racers {
            assert_eq!(answer_in(&racer.go()), "ok");
        }
        let dirs = std::fs::read_dir(pins).map_or(0, |d| d.count());
        let mounts = bpffs_mounts();
        if (mounts, dirs) != (1, RACERS) {
            return format!("round {round}: bpf mounts {mounts}, pin directories {dirs}");
        }
    }
    format!("{ROUNDS} rounds: bpf mounts 1, pin directories {RACERS}")
}

/// A private pin folder on bpffs, removed on drop.
struct Pins(PathBuf);

impl Pins {
    fn new(name: &str) -> Self {
        let dir = Path::new(BPFFS).join(format!("tessera-test-{}-{name}", std::process::id()));
        Self(dir)
    }
}

impl Drop for Pins {
    fn drop(&mut self) {
        if let Ok(entries) = std::fs::read_dir(&self.0) {
            for e in entries.flatten() {
                let _ = std::fs::remove_file(e.path());
            }
        }
        let _ = std::fs::remove_dir(&self.0);
    }
}

fn probe(test: &str, container: &Path) -> String {
    answer_in(&Child::spawn(test, "probe").join(container).go())
}

/// What the container can open once the kernel has let go of the links
/// whose last pin went. It frees a bpffs inode after an RCU grace period
/// and puts the link from a work queue, so a removed or replaced guard
/// may enforce for a moment after its pin is gone (a replaced one beside
/// its successor: the stricter wins). Probes until the answer is `want`,
/// for at most 5 s, and returns the last answer.
fn probe_settled(test: &str, container: &Path, want: &str) -> String {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let seen = probe(test, container);
        if seen == want || std::time::Instant::now() > deadline {
            return seen;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

fn apply(test: &str, pod: &Path, pins: &Path, allow: &str) -> u32 {
    let out = Child::spawn_with(
        test,
        "apply",
        &[
            (POD_ENV, pod.to_str().unwrap()),
            (PINS_ENV, pins.to_str().unwrap()),
            (ALLOW_ENV, allow),
        ],
    )
    .go();
    answer_in(&out).parse().unwrap()
}

fn guard_skip() -> Option<String> {
    skip_reason().or_else(|| artifact(GUARD_OBJECT).err())
}

fn pod_uid() -> String {
    // Unique per test process, a valid UUID.
    format!(
        "0000{:04x}-0000-4000-8000-{:012x}",
        std::process::id() & 0xffff,
        rand_tail()
    )
}

fn rand_tail() -> u64 {
    use std::time::{SystemTime, UNIX_EPOCH};
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        & 0xffff_ffff_ffff
}

#[test]
fn guard_denies_unassigned_gpus_survives_its_loader_and_goes_on_cleanup() {
    child_side();
    let test = "guard_denies_unassigned_gpus_survives_its_loader_and_goes_on_cleanup";
    skip_if!(guard_skip());
    let base = TestCgroup::new("guard");
    let uid = pod_uid();
    let pod = base.child(&format!("kubepods/besteffort/pod{uid}"));
    let container = base.child(&format!("kubepods/besteffort/pod{uid}/{CID}"));
    let pod_id = cgroup::cgroup_id(&pod).unwrap();
    let pins = Pins::new("guard");

    assert_eq!(
        probe(test, &container),
        "null=ok zero=ok full=ok random=ok",
        "before any guard"
    );

    // Applied by a process that exits: only the pin holds the guard.
    let link = apply(test, &pod, &pins.0, "/dev/zero");
    assert_eq!(
        probe(test, &container),
        "null=ok zero=ok full=EPERM random=ok",
        "1:7 is a GPU not assigned to the pod; 1:3 is control"
    );
    // The pod cgroup itself is guarded too, processes outside it are not.
    assert_eq!(probe(test, &pod), "null=ok zero=ok full=EPERM random=ok");
    assert!(std::fs::File::open("/dev/full").is_ok(), "outside the pod");

    let g = guards(&pins.0);
    let listed = g.list_guards().unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].pod_uid, uid);
    assert_eq!(listed[0].link_id, link);
    assert_eq!(listed[0].cgroup_id, Some(pod_id));

    // A new assignment replaces the old guard.
    let link2 = apply(test, &pod, &pins.0, "/dev/full");
    assert_ne!(link2, link);
    let want = "null=ok zero=EPERM full=ok random=ok";
    assert_eq!(probe_settled(test, &container, want), want);
    let listed = g.list_guards().unwrap();
    assert_eq!(listed.len(), 1, "the old pin was replaced: {listed:?}");
    assert_eq!(listed[0].link_id, link2);

    // No GPU at all.
    apply(test, &pod, &pins.0, "");
    let want = "null=ok zero=EPERM full=EPERM random=ok";
    assert_eq!(probe_settled(test, &container, want), want);

    // Cleanup removes enforcement.
    assert!(g.unguard_pod(&uid).unwrap());
    assert!(!g.unguard_pod(&uid).unwrap(), "already gone");
    assert!(g.list_guards().unwrap().is_empty());
    let want = "null=ok zero=ok full=ok random=ok";
    assert_eq!(probe_settled(test, &container, want), want, "after cleanup");
}

#[test]
fn guards_of_removed_pods_are_pruned_and_bad_paths_refused() {
    child_side();
    skip_if!(guard_skip());
    let base = TestCgroup::new("guard-prune");
    let uid = pod_uid();
    let pod = base.child(&format!("kubepods/pod{uid}"));
    let container = base.child(&format!("kubepods/pod{uid}/{CID}"));
    let pins = Pins::new("prune");
    let g = guards(&pins.0);

    let err = g.guard_pod(&container, &[]).unwrap_err().to_string();
    assert!(err.contains("is a container cgroup of pod"), "{err}");
    let err = g.guard_pod(&base.0, &[]).unwrap_err().to_string();
    assert!(
        err.ends_with("is not a pod cgroup: not a kubepods pod path"),
        "{err}"
    );

    let info = g.guard_pod(&pod, &[(1, 5)]).unwrap();
    assert_eq!(info.pod_uid, uid);
    assert!(info.cgroup_id.is_some());
    assert!(g.prune().unwrap().is_empty(), "the pod still exists");

    // The pod goes: the kernel detaches the link; prune removes the pin.
    std::fs::remove_dir(&container).unwrap();
    std::fs::remove_dir(&pod).unwrap();
    let mut pruned = Vec::new();
    for _ in 0..100 {
        pruned = g.prune().unwrap();
        if !pruned.is_empty() {
            break;
        }
        // The cgroup is released asynchronously.
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(pruned, vec![uid]);
    assert!(g.list_guards().unwrap().is_empty());
}

#[test]
fn a_failed_replacement_leaves_no_hidden_guard_and_prune_sweeps_leftovers() {
    child_side();
    let test = "a_failed_replacement_leaves_no_hidden_guard_and_prune_sweeps_leftovers";
    skip_if!(guard_skip());
    let base = TestCgroup::new("guard-leftover");
    let uid = pod_uid();
    let pod = base.child(&format!("kubepods/pod{uid}"));
    let container = base.child(&format!("kubepods/pod{uid}/{CID}"));
    let pins = Pins::new("leftover");
    let g = guards(&pins.0);
    let tmp = pins.0.join(format!("new-{uid}"));
    let unguarded = "null=ok zero=ok full=ok random=ok";

    // A directory where the pin goes makes the rename fail. It goes into
    // the pin directory, which the guard prepares (mounting bpffs).
    g.ensure_pin_dir().unwrap();
    std::fs::create_dir_all(pins.0.join(&uid)).unwrap();
    let err = g.guard_pod(&pod, &[(1, 5)]).unwrap_err().to_string();
    assert!(err.starts_with("cannot rename device guard pin"), "{err}");
    assert!(!tmp.exists(), "the temporary pin is removed");
    assert_eq!(
        probe_settled(test, &container, unguarded),
        unguarded,
        "and its link with it"
    );
    std::fs::remove_dir(pins.0.join(&uid)).unwrap();

    // A temporary pin left by an agent stopped mid-replacement: enforcing,
    // but not listed; prune removes it.
    g.guard_pod(&pod, &[(1, 5)]).unwrap();
    std::fs::rename(pins.0.join(&uid), &tmp).unwrap();
    assert!(g.list_guards().unwrap().is_empty());
    assert_eq!(
        probe(test, &container),
        "null=ok zero=ok full=EPERM random=ok"
    );
    assert!(g.prune().unwrap().is_empty(), "no pod was removed");
    assert!(!tmp.exists());
    assert_eq!(probe_settled(test, &container, unguarded), unguarded);
}

/// A new node has no bpffs, and the first guards are set up by several
/// processes at once (the agent and its helpers, or parallel tests): they
/// must end up on one bpffs. A second mount stacked on the first is a new
/// file system that hides every pin made on the first, so a process-local
/// check would lose guards from sight. Run in a mount namespace of its own
/// (`unshare(1)`), so the host's bpffs is untouched.
#[test]
fn processes_preparing_pins_at_once_on_a_new_node_share_one_bpffs() {
    child_side();
    skip_if!(guard_skip().or_else(|| {
        support::on_path("unshare")
            .is_none()
            .then(|| "unshare(1) is not installed (util-linux)".to_owned())
    }));
    let pins = Pins::new("race");
    let new_node = Child::spawn_wrapped(
        &["unshare", "--mount", "--propagation", "private"],
        RACE_TEST,
        "new-node",
        &[(PINS_ENV, pins.0.to_str().unwrap())],
    );
    assert_eq!(
        answer_in(&new_node.go()),
        format!("{ROUNDS} rounds: bpf mounts 1, pin directories {RACERS}")
    );
    assert!(
        !pins.0.exists(),
        "the pins were made in the test's own mount namespace, not here"
    );
}
