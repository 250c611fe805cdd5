//! Privileged test: the simulated GPU node's own ioctls are attributed to
//! the right cgroups. Two processes in two fresh cgroups drive the
//! simulator's `libcuda.so.1` through a small C program
//! (`ebpf_gpusim/cuda_alloc.c`): cuInit (NV_ESC_CHECK_VERSION_STR on the
//! control stand-in `/dev/null`), a context (NV_ESC_REGISTER_FD on the GPU
//! stand-in `/dev/full`, UVM_REGISTER_GPU on the UVM stand-in `/dev/zero`),
//! cuMemAlloc (NV_ESC_RM_ALLOC, class 0x40) and cuMemFree (NV_ESC_RM_FREE).
//! The counts per cgroup and device, the UVM GPU registration, the memory
//! estimate and the bypass report must be exact.
//!
//! Skipped (with the reason) without root, the object, the simulator
//! (`$TESSERA_ARTIFACTS/sim/libcuda.so.1`) or a C compiler.
#![allow(
    clippy::unwrap_used,
    reason = "test code unwraps; clippy only exempts #[test] functions themselves"
)]

mod ebpf_support;
use ebpf_support as support;

use tessera_testkit::sim;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{ChildStdout, Command, Stdio};
use std::time::Duration;

use sim::{Gpu, NodeSpec};
use support::{TestCgroup, artifact, devices, object, or_skip, skip_if, skip_reason};
use tessera_agent::ebpf::{Access, Bypass, Observer, ObserverConfig};
use tessera_ebpf_common::{
    dev::kdev,
    ioctl::flags,
    rm::{NV_ESC_RM_ALLOC, NV_ESC_RM_FREE},
    uvm::UVM_REGISTER_GPU,
};

const UUID: &str = "GPU-12345678-9abc-def0-0123-456789abcdef";
const NV_ESC_CHECK_VERSION_STR: u32 = 0xD2;
const NV_ESC_REGISTER_FD: u32 = 0xC9;
const MIB: u64 = 1 << 20;

fn node_spec() -> NodeSpec {
    NodeSpec::new()
        .gpu(Gpu::sim(4096).uuid(UUID))
        .ioctl_devices(&["/dev/full"])
}

/// Compiles the C client against the simulator's libcuda.
fn compile(dir: &Path, sim: &Path) -> Result<PathBuf, String> {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/ebpf_gpusim/cuda_alloc.c");
    let exe = dir.join("cuda_alloc");
    let out = Command::new("cc")
        .arg(&source)
        .arg("-o")
        .arg(&exe)
        .arg(format!("-L{}", sim.display()))
        .arg("-l:libcuda.so.1")
        .arg(format!("-Wl,-rpath,{}", sim.display()))
        .output()
        .map_err(|e| format!("no C compiler (cc): {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "cc failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(exe)
}

/// The compiled client and the simulated node it runs on.
struct SimNode {
    exe: PathBuf,
    node: sim::Node,
}

/// What a client does: allocations, their size, frees.
struct Work {
    allocs: u32,
    bytes: u64,
    frees: u32,
}

/// A running client, stopped at "ready".
struct Client {
    child: std::process::Child,
    stdout: BufReader<ChildStdout>,
}

impl Client {
    fn start(sim: &SimNode, cgroup: &Path, work: Work, before_go: impl FnOnce(u32)) -> Self {
        let mut child = sim
            .node
            .command(&sim.exe)
            .args([
                work.allocs.to_string(),
                work.bytes.to_string(),
                work.frees.to_string(),
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        std::fs::write(cgroup.join("cgroup.procs"), child.id().to_string()).unwrap();
        before_go(child.id());
        child.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready", "client did not get ready");
        Self { child, stdout }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn finish(mut self) {
        self.child
            .stdin
            .as_mut()
            .unwrap()
            .write_all(b"exit\n")
            .unwrap();
        let mut rest = String::new();
        let _ = std::io::Read::read_to_string(&mut self.stdout, &mut rest);
        let status = self.child.wait().unwrap();
        assert!(status.success(), "client failed: {status}");
    }
}

#[test]
fn simulated_driver_calls_are_attributed_to_their_cgroups() {
    skip_if!(skip_reason());
    or_skip!(artifact("sim/libcuda.so.1"));
    let node = node_spec().build();
    let exe = or_skip!(compile(node.dir.path(), &sim::sim_dir()));
    let sim = SimNode { exe, node };

    let base = TestCgroup::new("gpusim");
    let a = TestCgroup::at(base.0.join("a"));
    let b = TestCgroup::at(base.0.join("b"));
    let (null, zero, full) = (kdev(1, 3), kdev(1, 5), kdev(1, 7));

    let stand_ins = devices(&["control=/dev/null", "uvm=/dev/zero", "gpu=/dev/full"]);
    let mut config = ObserverConfig::new(object().unwrap(), stand_ins);
    config.driver_major = Some(595);
    let mut observer = Observer::start(&config).unwrap();
    let mut events = observer.bypass_events().unwrap();
    observer.audit_opens(&base.0).unwrap();
    observer.watch_cgroup(a.id()).unwrap();
    observer.watch_cgroup(b.id()).unwrap();

    // A: unregistered, 3 × 8 MiB, frees one. B: registered, 1 × 64 MiB.
    let work_a = Work {
        allocs: 3,
        bytes: 8 * MIB,
        frees: 1,
    };
    let client_a = Client::start(&sim, &a.0, work_a, |_| {});
    let work_b = Work {
        allocs: 1,
        bytes: 64 * MIB,
        frees: 0,
    };
    let client_b = Client::start(&sim, &b.0, work_b, |pid| {
        observer.register_tgid(pid).unwrap();
    });
    let snap = observer.snapshot().unwrap();

    for (cg, allocs, frees) in [(&a, 3, 1), (&b, 1, 0)] {
        let id = cg.id();
        let mine = snap.ioctls_of(id);
        let nr = |dev, nr, fl| snap.ioctls_nr(id, dev, nr, fl);
        assert_eq!(nr(null, NV_ESC_CHECK_VERSION_STR, 0), 1, "{mine:?}");
        assert_eq!(nr(null, NV_ESC_RM_ALLOC, 0), allocs, "{mine:?}");
        assert_eq!(nr(null, NV_ESC_RM_FREE, 0), frees, "{mine:?}");
        assert_eq!(nr(zero, UVM_REGISTER_GPU, flags::RAW), 1, "{mine:?}");
        assert_eq!(nr(full, NV_ESC_REGISTER_FD, 0), 1, "{mine:?}");
        let total: u64 = mine.iter().map(|(_, n)| n).sum();
        assert_eq!(total, 3 + allocs + frees, "nothing else: {mine:?}");
        // Two opens of the GPU's node: cuInit's (is this GPU the
        // process's? a driver lists only the GPUs it can open) and the
        // channel's.
        assert_eq!(snap.opens_of(id, full), 2);
        let gpus = snap.gpus_of(id);
        assert_eq!(gpus.len(), 1, "{gpus:?}");
        assert_eq!(Some(gpus[0].0), gpusim::node::uuid_bytes(UUID));
        assert_eq!(gpus[0].1.registrations, 1);
    }
    assert_eq!(snap.gpus_of(a.id())[0].1.first_tgid, client_a.pid());
    assert_eq!(snap.gpus_of(b.id())[0].1.first_tgid, client_b.pid());

    // The memory estimate: requested sizes, frees matched by handle.
    let pa = snap.rm_procs[&client_a.pid()];
    assert_eq!(pa.cgroup_id, a.id());
    assert_eq!((pa.allocs, pa.frees), (3, 1));
    assert_eq!(pa.live(), 16 * MIB);
    assert_eq!(snap.rm_bytes_of(a.id()), 16 * MIB);
    assert_eq!(snap.rm_bytes_of(b.id()), 64 * MIB);

    // Only the unregistered client is reported, at its first access: the
    // open of its GPU's stand-in (cuInit looks at which GPUs it can open
    // before it talks to the control device).
    let pids = [client_a.pid(), client_b.pid()];
    client_a.finish();
    client_b.finish();
    let mut seen: Vec<Bypass> = events.drain();
    if events.wait(Duration::from_millis(200)).unwrap() {
        seen.extend(events.drain());
    }
    let ours: Vec<&Bypass> = seen.iter().filter(|e| pids.contains(&e.tgid)).collect();
    assert_eq!(ours.len(), 1, "{ours:#?}");
    assert_eq!(ours[0].tgid, pids[0]);
    assert_eq!(ours[0].cgroup_id, a.id());
    assert_eq!((ours[0].major, ours[0].minor), (1, 7));
    assert!(
        matches!(ours[0].access, Access::Open { .. }),
        "{:?}",
        ours[0]
    );

    // Exited processes leave the estimate.
    if observer.exit_hook() {
        let after = observer.snapshot().unwrap();
        assert!(!after.rm_procs.contains_key(&pids[0]));
        assert!(!after.rm_procs.contains_key(&pids[1]));
    }
}
