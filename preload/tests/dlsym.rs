//! `dlsym` under `libtessera.so`: only the real driver gets real answers.
//! A library that merely has a driver-like file name is limited like any
//! other code, whichever way it asks; the driver looking up its own
//! functions still finds them. The simulator's accounting is the judge.

mod common;

use std::path::{Path, PathBuf};

use common::{Container, MIB, field, memory_limit};

/// Builds the helper library as `dir/name` (linked against the
/// simulator's libcuda, so RTLD_NEXT from it finds the driver) and the
/// probe that loads it.
fn build(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    let sim = common::sim::sim_dir();
    let helper = dir.join(name);
    common::sim::cc(&[
        "-shared",
        "-fPIC",
        concat!(env!("CARGO_MANIFEST_DIR"), "/tests/c/dlsym_helper.c"),
        "-o",
        helper.to_str().expect("utf-8 path"),
        &format!("-L{}", sim.display()),
        "-Wl,--no-as-needed",
        "-lcuda",
        "-lnvidia-ml",
        "-ldl",
    ]);
    let probe = dir.join("dlsym_escape");
    common::sim::cc(&[
        concat!(env!("CARGO_MANIFEST_DIR"), "/tests/c/dlsym_escape.c"),
        "-o",
        probe.to_str().expect("utf-8 path"),
        "-ldl",
    ]);
    (helper, probe)
}

#[test]
fn a_library_named_like_the_driver_is_limited_and_the_driver_is_not() {
    // 1000 MiB: the 300 MiB context leaves seven 100 MiB allocations.
    let c = Container::new(|u| memory_limit(u, 1000));
    let sim = c.node.sim();
    let dir = tempfile::tempdir().unwrap();
    for name in [
        "libcuda.so.helper",
        "libnvidia-ml.so.helper",
        "libcuda.so.1.x",
    ] {
        let (helper, probe) = build(dir.path(), name);
        for how in ["0", "1"] {
            let mut cmd = c.command(&probe);
            cmd.arg(&helper).arg(how);
            let p = common::sim::spawn_command_ready(cmd, name);
            assert_eq!(
                field(&p.seen.join("\n"), "allocs"),
                ["7", "2"],
                "{name} (how {how}): refused at the limit with CUDA_ERROR_OUT_OF_MEMORY"
            );
            // NVML functions it found itself show the limit too.
            assert_eq!(
                field(&p.seen.join("\n"), "nvml-total"),
                [(1000 * MIB).to_string()],
                "{name} (how {how})"
            );
            // The driver (the simulator) holds exactly the limit for it.
            let held: u64 = sim
                .processes(0)
                .unwrap()
                .iter()
                .filter(|x| x.pid == p.pid())
                .map(|x| x.bytes)
                .sum();
            assert_eq!(held, 1000 * MIB, "{name} (how {how})");
            // The driver's own lookups find its own functions.
            assert_eq!(
                field(&p.seen.join("\n"), "driver-own"),
                ["1", "0"],
                "{name} {how}"
            );
            p.kill();
        }
    }
}
