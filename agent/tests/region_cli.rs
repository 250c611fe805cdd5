//! `tessera-agent region create|set|show`: what it writes is read back by
//! the region ABI crate itself (the library's view), updates reach a
//! mapping held by a running reader, `show` reports what processes
//! recorded in the usage region, and bad input is refused by name.
#![allow(
    clippy::unwrap_used,
    reason = "test code unwraps; clippy only exempts #[test] functions themselves"
)]

use std::path::Path;
use std::process::{Command, Output};

use tessera_region::UNLIMITED;
use tessera_region::file::{CONTROL_FILE, USAGE_FILE, open_control, open_usage};
use tessera_region::layout::FLAG_FAIL_OPEN;
use tessera_region::spec::parse_uuid;

const U0: &str = "GPU-5e1a0000-0000-4000-8000-000051510000";
const U1: &str = "GPU-5e1a0000-0000-4000-8000-000051510001";
const MIB: u64 = 1 << 20;

fn agent(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tessera-agent"))
        .args(args)
        .output()
        .unwrap()
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn path(d: &Path) -> &str {
    d.to_str().unwrap()
}

#[test]
fn create_set_and_show_round_trip_through_the_region_files() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ctr");
    let g0 = format!("{U0},memory=4000,overhead=300,rate=20000");
    ok(&agent(&[
        "region",
        "create",
        "--dir",
        path(&dir),
        "--gpu",
        &g0,
        "--gpu",
        U1,
        "--fail-open",
    ]));
    // The library's view of what the agent wrote.
    let control = open_control(&dir.join(CONTROL_FILE)).unwrap();
    control.validate(control.mapped_len()).unwrap();
    let snap = control.snapshot();
    assert_eq!(snap.flags & FLAG_FAIL_OPEN, FLAG_FAIL_OPEN);
    assert_eq!(snap.gpus.len(), 2);
    let g = snap.gpus[0];
    assert_eq!(g.uuid, parse_uuid(U0).unwrap());
    assert_eq!(
        (
            g.memory_limit,
            g.context_overhead,
            g.launch_rate,
            g.launch_burst
        ),
        (4000 * MIB, 300 * MIB, 20000, 200)
    );
    assert_eq!(snap.gpus[1].memory_limit, UNLIMITED);
    let mode = |name| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(dir.join(name))
            .unwrap()
            .permissions()
            .mode()
            & 0o777
    };
    assert_eq!((mode(CONTROL_FILE), mode(USAGE_FILE)), (0o644, 0o666));

    // A process records usage; `show` reports it.
    let usage = open_usage(&dir.join(USAGE_FILE)).unwrap();
    let me = std::process::id();
    let claim = usage.claim(me, 1).unwrap();
    usage.reserve(0, claim.slot, 123 * MIB, 4000 * MIB).unwrap();
    let shown: serde_json::Value =
        serde_json::from_str(&ok(&agent(&["region", "show", "--dir", path(&dir)]))).unwrap();
    assert_eq!(shown["fail_open"], true);
    assert_eq!(shown["gpus"][0]["uuid"], U0);
    assert_eq!(shown["gpus"][0]["memory_limit"], 4000 * MIB);
    assert_eq!(shown["gpus"][0]["used"], 123 * MIB);
    assert_eq!(shown["gpus"][1]["launch_rate"], "unlimited");
    assert_eq!(shown["processes"][0]["pid"], me);
    assert_eq!(shown["processes"][0]["used"][0], 123 * MIB);

    // `set` reaches the mapping this process already holds.
    let before = control.epoch();
    let g0 = format!("{U0},memory=2000,rate=5000,burst=7");
    ok(&agent(&[
        "region",
        "set",
        "--dir",
        path(&dir),
        "--gpu",
        &g0,
    ]));
    let snap = control.snapshot();
    assert!(snap.epoch > before);
    assert_eq!(snap.flags & FLAG_FAIL_OPEN, 0);
    assert_eq!(snap.gpus.len(), 1);
    assert_eq!(
        (
            snap.gpus[0].memory_limit,
            snap.gpus[0].launch_rate,
            snap.gpus[0].launch_burst
        ),
        (2000 * MIB, 5000, 7)
    );
    // The usage region is kept by a second create.
    ok(&agent(&[
        "region",
        "create",
        "--dir",
        path(&dir),
        "--gpu",
        U0,
    ]));
    assert!(usage.owns(claim), "the usage file was not replaced");
}

#[test]
fn bad_input_is_refused_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ctr");
    let out = agent(&["region", "create", "--dir", path(&dir), "--gpu", "GPU-nope"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("\"GPU-nope\" is not a GPU UUID"), "{err}");
    assert!(!dir.exists(), "nothing was created");
    let out = agent(&[
        "region",
        "create",
        "--dir",
        path(&dir),
        "--gpu",
        &format!("{U0},memory=lots"),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("\"memory=lots\" needs a whole number"),
        "{err}"
    );
    // `set` and `show` on a directory without regions name it and the file.
    for cmd in [
        vec!["region", "set", "--dir", path(&dir), "--gpu", U0],
        vec!["region", "show", "--dir", path(&dir)],
    ] {
        let out = agent(&cmd);
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!("region directory {}", dir.display())),
            "{err}"
        );
        assert!(err.contains("control"), "{err}");
    }
}
