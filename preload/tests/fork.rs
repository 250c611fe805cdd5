//! Forking under `libtessera.so` while another thread is inside the
//! interposer: the child's first calls never wait for a lock that a thread
//! of the parent (which the child does not have) held at the fork.

mod common;

use common::{Container, field, memory_limit};

#[test]
fn a_child_forked_mid_call_never_waits_for_the_parents_locks() {
    let c = Container::new(|u| memory_limit(u, 4000));
    let dir = tempfile::tempdir().unwrap();
    let probe = common::linked_probe(dir.path(), "fork_locks");
    // cuda: a thread allocates while the children ask NVML; nvml: a
    // thread reads memory information while the children allocate. Each
    // child's calls take the locks the parent's thread keeps taking.
    for mode in ["cuda", "nvml"] {
        let out = c.command(&probe).args([mode, "300"]).output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{mode}: {out:?}");
        assert_eq!(
            field(&stdout, "forks"),
            ["300", "0", "0"],
            "{mode}: every child finished, none hung, none failed"
        );
    }
}
