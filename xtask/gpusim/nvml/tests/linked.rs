//! A C program linked with `-lnvidia-ml` against the stand-in reads the
//! node description back through NVML, and the error paths return the
//! codes the NVML documentation gives.

mod common;

use std::time::Duration;

use common::{Node, NodeExt, keys, run, three_gpus};
use gpusim::layout::ItemKind;

const MIB: u64 = 1 << 20;

#[test]
fn devices_match_the_node_description() {
    let node = three_gpus().build();
    let probe = node.compile("probe.c", true);
    let out = run(node.command(&probe));
    assert!(out.status.success(), "{out:?}");
    let k = keys(&out.stdout);
    let get = |key: &str| {
        k.get(key)
            .unwrap_or_else(|| panic!("no {key} in {k:#?}"))
            .as_str()
    };

    assert_eq!(get("before_init"), "1", "UNINITIALIZED before nvmlInit");
    assert_eq!(get("driver"), "550.54.15");
    assert_eq!(get("nvml_version"), "12.550.54.15");
    assert_eq!(get("cuda"), "12040");
    assert_eq!(get("count"), "3");

    assert_eq!(get("gpu0.name"), "NVIDIA A100-SXM4-80GB");
    assert_eq!(get("gpu2.name"), "NVIDIA L4");
    assert_eq!(get("gpu0.uuid"), "GPU-11111111-2222-3333-4444-555555555555");
    assert_eq!(get("gpu1.uuid"), "GPU-5e1a0000-0000-4000-8000-000051510001");
    assert_eq!(get("gpu2.index"), "2");
    assert_eq!(get("gpu2.minor"), "2");

    // v1 counts the driver's reserve as used; v2 reports it apart.
    let total = 81920 * MIB;
    assert_eq!(get("gpu0.mem.total"), total.to_string());
    assert_eq!(get("gpu0.mem.used"), (512 * MIB).to_string());
    assert_eq!(get("gpu0.mem.free"), (total - 512 * MIB).to_string());
    assert_eq!(get("gpu0.mem2.ret"), "0");
    assert_eq!(get("gpu0.mem2.total"), total.to_string());
    assert_eq!(get("gpu0.mem2.reserved"), (512 * MIB).to_string());
    assert_eq!(get("gpu0.mem2.used"), "0");
    assert_eq!(get("gpu0.mem2.free"), (total - 512 * MIB).to_string());
    assert_eq!(get("gpu2.mem.total"), (23034 * MIB).to_string());

    assert_eq!(get("gpu0.pci.busId"), "00000000:3B:00.0");
    assert_eq!(get("gpu0.pci.busIdLegacy"), "0000:3B:00.0");
    assert_eq!(get("gpu0.pci.bus"), "59");
    assert_eq!(get("gpu0.pci.deviceId"), "0x20b210de");
    assert_eq!(get("gpu1.pci.busId"), "00000000:5E:00.0");

    assert_eq!(get("gpu0.numa"), "0");
    assert_eq!(get("gpu2.numa"), "1");
    assert_eq!(get("gpu0.cc"), "8.0");
    assert_eq!(get("gpu2.cc"), "8.9");
    assert_eq!(get("gpu0.cores"), (108 * 64).to_string());
    assert_eq!(get("gpu2.cores"), (58 * 128).to_string());
    assert_eq!(get("gpu0.mig"), "1/1");
    assert_eq!(get("gpu1.mig"), "0/0");

    // Link 0 of each A100 reaches the other; link 1 is inactive; the L4
    // has no NVLink at all (NOT_SUPPORTED).
    assert_eq!(get("gpu0.nvlink0.remote"), "00000000:5E:00.0");
    assert_eq!(get("gpu1.nvlink0.remote"), "00000000:3B:00.0");
    assert_eq!(get("gpu0.nvlink.active"), "1");
    assert_eq!(get("gpu2.nvlink.end"), "0:3");
    assert_eq!(get("topo.0.0"), "0", "INTERNAL");
    assert_eq!(get("topo.0.1"), "40", "NODE: same NUMA node");
    assert_eq!(get("topo.0.last"), "50", "SYSTEM: across NUMA nodes");
    assert_eq!(get("by_uuid"), "1");
    assert_eq!(get("by_bus"), "1");

    // Idle node: no processes (size query succeeds with 0), no samples.
    assert_eq!(get("gpu1.procs.size.ret"), "0");
    assert_eq!(get("gpu1.procs.n"), "0");
    assert_eq!(get("gpu1.graphics.ret"), "0");
    assert_eq!(get("gpu1.graphics.n"), "0");
    assert_eq!(
        get("gpu1.samples.size.ret"),
        "6",
        "NOT_FOUND without samples"
    );
    assert_eq!(get("gpu1.util.gpu"), "0");
    assert_eq!(get("gpu1.power"), "70000", "idle power");
    assert_eq!(get("gpu1.temp.ret"), "0");
    assert_eq!(get("gpu1.smclock.ret"), "0");

    assert_eq!(get("err.null_count"), "2");
    assert_eq!(get("err.small_name"), "7");
    assert_eq!(get("err.mem_version"), "25");
    assert_eq!(get("err.null_mem"), "2");
    assert_eq!(get("err.forged_handle"), "2");
    assert_eq!(get("err.stack_handle"), "2");
    assert_eq!(get("err.bad_index"), "2");
    assert_eq!(get("err.unknown_uuid"), "6");
    assert_eq!(get("err.nvlink_past_max"), "2");
    assert_eq!(get("err.string15"), "GPU is lost");
    assert_eq!(get("err.string_unknown"), "Unknown Error");

    assert_eq!(get("shutdown1"), "0");
    assert_eq!(get("after_one_shutdown"), "0", "still initialised once");
    assert_eq!(get("shutdown2"), "0");
    assert_eq!(get("after_two_shutdowns"), "1");
    assert_eq!(get("shutdown3"), "1");
}

#[test]
fn processes_and_utilisation_come_from_the_shared_state() {
    let node = three_gpus().build();
    let probe = node.compile("probe.c", true);

    // This test process holds a context and 1 GiB on GPU 0 and keeps its
    // SMs busy while the probe looks.
    let sim = node.sim();
    let a = sim.attach(0).unwrap();
    sim.alloc(&a, 1024 * MIB).unwrap();
    sim.submit(&a, ItemKind::Kernel, 10_000_000_000).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let me = std::process::id();
    let held = sim.context_overhead() + 1024 * MIB;

    let out = run(node.command(&probe));
    assert!(out.status.success(), "{out:?}");
    let k = keys(&out.stdout);
    let get = |key: &str| {
        k.get(key)
            .unwrap_or_else(|| panic!("no {key} in {k:#?}"))
            .as_str()
    };

    assert_eq!(
        get("gpu0.procs.size.ret"),
        "7",
        "INSUFFICIENT_SIZE for a size query"
    );
    assert_eq!(get("gpu0.procs.size"), "1");
    assert_eq!(get("gpu0.procs.ret"), "0");
    assert_eq!(get("gpu0.proc0"), format!("{me}:{held}:ffffffff"));
    assert_eq!(get("gpu0.proc0.v1"), format!("{me}:{held}"));
    assert_eq!(get("gpu0.mem2.used"), held.to_string());
    assert_eq!(get("gpu0.mem.used"), (held + 512 * MIB).to_string());

    let util: u32 = get("gpu0.util.gpu").parse().unwrap();
    assert!((20..=100).contains(&util), "utilisation {util}");
    assert_eq!(get("gpu0.samples.size.ret"), "7");
    assert_eq!(get("gpu0.samples.size"), "1");
    let (pid, sm) = get("gpu0.sample0").split_once(':').unwrap();
    assert_eq!(pid, me.to_string());
    assert!(sm.parse::<u32>().unwrap() > 0, "sample {sm}");
    let power: u32 = get("gpu0.power").parse().unwrap();
    assert!(power > 70_000, "power {power} follows utilisation");

    // Other GPUs are untouched.
    assert_eq!(get("gpu1.procs.n"), "0");
    assert_eq!(get("gpu1.samples.size.ret"), "6");
}

#[test]
fn a_lost_gpu_reports_gpu_is_lost_but_keeps_its_identity() {
    let node = three_gpus().build();
    let probe = node.compile("probe.c", true);
    node.gpusim(&["lost", "1"]);

    let out = run(node.command(&probe));
    assert!(out.status.success(), "{out:?}");
    let k = keys(&out.stdout);
    let get = |key: &str| {
        k.get(key)
            .unwrap_or_else(|| panic!("no {key} in {k:#?}"))
            .as_str()
    };
    assert_eq!(get("gpu1.name.ret"), "0");
    assert_eq!(get("gpu1.uuid"), "GPU-5e1a0000-0000-4000-8000-000051510001");
    for q in [
        "mem", "mem2", "util", "procs", "samples", "mig", "temp", "power", "smclock",
    ] {
        assert_eq!(get(&format!("gpu1.{q}.ret")), "15", "{q} on a lost GPU");
    }
    assert_eq!(get("gpu1.nvlink.end"), "0:15");
    assert_eq!(get("gpu0.mem.ret"), "0", "other GPUs are fine");

    node.gpusim(&["lost", "1", "--clear"]);
    let k = keys(&run(node.command(&probe)).stdout);
    assert_eq!(k["gpu1.mem.ret"], "0");
}

#[test]
fn init_fails_with_one_clear_line_when_the_state_file_is_foreign() {
    let node = three_gpus().build();
    let probe = node.compile("probe.c", true);
    let mut garbage = b"OLDGPUSIM".to_vec();
    garbage.resize(256 << 10, 0xAB);
    std::fs::write(&node.state, garbage).unwrap();

    let out = run(node.command(&probe));
    let k = keys(&out.stdout);
    assert_eq!(k["fail"], "nvmlInit_v2() -> 9", "DRIVER_NOT_LOADED");
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("cannot open the simulated GPU node"), "{err}");
    assert!(err.contains(&node.state.display().to_string()), "{err}");
    assert!(
        err.contains("does not start with the gpusim magic"),
        "{err}"
    );

    // The way out.
    node.gpusim(&["reset", "--remove"]);
    let out = run(node.command(&probe));
    assert!(out.status.success(), "{out:?}");
    assert_eq!(keys(&out.stdout)["count"], "3");
}

#[test]
fn init_names_the_bad_field_of_a_node_description() {
    let node = Node::new("[[gpu]]\nmodel = \"x\"\nmemory_mib = 1024\nsm_count = 0\n");
    let probe = node.compile("probe.c", true);
    let out = run(node.command(&probe));
    assert_eq!(keys(&out.stdout)["fail"], "nvmlInit_v2() -> 9");
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("gpu[0].sm_count is 0; accepted: 1 to 1024"),
        "{err}"
    );
    assert!(err.contains(&node.node.display().to_string()), "{err}");
}
