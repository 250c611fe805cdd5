//! Xid events: injected by `gpusim` in another process, received by a C
//! program blocked in `nvmlEventSetWait_v2`.

mod common;

use std::io::{BufRead, BufReader, Lines};
use std::process::{ChildStdout, Stdio};

use common::{NodeExt, three_gpus};

fn next(lines: &mut Lines<BufReader<ChildStdout>>) -> String {
    lines
        .next()
        .expect("the program ended early")
        .expect("cannot read its output")
}

#[test]
fn xids_from_another_process_arrive_as_events() {
    let node = three_gpus().build();
    let exe = node.compile("events.c", true);
    // An Xid before registration is not delivered.
    node.gpusim(&["xid", "1", "31"]);

    let mut child = node
        .command(&exe)
        .args(["1", "3"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    assert_eq!(next(&mut lines), "supported=8");
    assert_eq!(next(&mut lines), "register_unsupported=3", "NOT_SUPPORTED");
    assert_eq!(next(&mut lines), "register=0");
    assert_eq!(next(&mut lines), "quick_wait=10", "TIMEOUT");
    assert_eq!(next(&mut lines), "ready");

    node.gpusim(&["xid", "1", "43"]);
    assert_eq!(next(&mut lines), "event gpu=1 type=8 xid=43 gi=ffffffff");

    // GPU 0 is not registered; losing GPU 1 records Xid 79, and once that
    // is delivered the set reports the GPU lost.
    node.gpusim(&["xid", "0", "13"]);
    node.gpusim(&["lost", "1"]);
    assert_eq!(next(&mut lines), "event gpu=1 type=8 xid=79 gi=ffffffff");
    assert_eq!(next(&mut lines), "wait=15", "GPU_IS_LOST");
    assert_eq!(next(&mut lines), "mem_after=15");
    assert_eq!(next(&mut lines), "free=0");
    assert_eq!(next(&mut lines), "free_again=2");
    assert!(child.wait().unwrap().success());
}
