//! Loading the stand-in at run time by its SONAME, as nvml-wrapper and
//! most tools do.

mod common;

use common::{NodeExt, keys, run, sim_dir, three_gpus};

#[test]
fn dlopen_by_soname_finds_every_symbol_and_device() {
    let node = three_gpus().build();
    let exe = node.compile("dlopen.c", false);
    let mut cmd = node.command(&exe);
    cmd.env("LD_LIBRARY_PATH", sim_dir());
    let out = run(cmd);
    assert!(out.status.success(), "{out:?}");
    let k = keys(&out.stdout);
    assert_eq!(k["missing_symbol"], "1");
    assert_eq!(k["init"], "0");
    assert_eq!(k["count"], "3");
    assert_eq!(
        k["gpu0"],
        "NVIDIA A100-SXM4-80GB|GPU-11111111-2222-3333-4444-555555555555"
    );
    assert_eq!(
        k["gpu2"],
        "NVIDIA L4|GPU-5e1a0000-0000-4000-8000-000051510002"
    );
    assert_eq!(k["shutdown"], "0");
}
