//! The operator's side of the policy: `tessera-agent policy check` and the
//! container CLI's labels and optional mode/priority, through the real
//! binary; judged by its exit status, its output and the metadata file it
//! writes.
#![allow(
    clippy::unwrap_used,
    reason = "test code unwraps; clippy only exempts #[test] functions themselves"
)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const GPU: &str = "GPU-5e1a0000-0000-4000-8000-000051510000";

fn agent(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tessera-agent"))
        .env_remove("TESSERA_ROOT")
        .args(args)
        .output()
        .unwrap()
}

fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/examples/policy.yaml")
}

#[test]
fn policy_check_prints_the_policy_or_the_error() {
    let out = agent(&["policy", "check", example().to_str().unwrap()]);
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("accepted, 3 rule(s)"), "{stdout}");
    assert!(
        stdout.contains("name: research-lends-idle-compute"),
        "{stdout}"
    );
    // What it prints is itself a policy file that passes.
    let dir = tempfile::tempdir().unwrap();
    let printed = dir.path().join("printed.yaml");
    std::fs::write(&printed, &stdout).unwrap();
    let again = agent(&["policy", "check", printed.to_str().unwrap()]);
    assert!(again.status.success());
    assert_eq!(
        String::from_utf8(again.stdout)
            .unwrap()
            .lines()
            .skip(1)
            .collect::<Vec<_>>(),
        stdout.lines().skip(1).collect::<Vec<_>>()
    );

    // The example with the action it used to have: refused, exit 1.
    let bad = dir.path().join("bad.yaml");
    let text = std::fs::read_to_string(example())
        .unwrap()
        .replace("bypassAction: freeze", "bypassAction: hold");
    let line = text
        .lines()
        .position(|l| l.contains("bypassAction: hold"))
        .unwrap()
        + 1;
    std::fs::write(&bad, text).unwrap();
    let out = agent(&["policy", "check", bad.to_str().unwrap()]);
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(out.stdout.is_empty());
    for says in [
        bad.to_str().unwrap(),
        &format!("line {line}, column"),
        "defaults.bypassAction",
        "unknown variant `hold`",
        "`alert`, `deny`, `freeze`, `kill`",
    ] {
        assert!(stderr.contains(says), "{stderr:?} lacks {says:?}");
    }
    let out = agent(&[
        "policy",
        "check",
        dir.path().join("none.yaml").to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("none.yaml"));
}

fn meta(root: &Path, id: &str) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(root.join(id).join("meta.json")).unwrap()).unwrap()
}

fn container_ok(root: &Path, args: &[&str]) {
    let mut a = vec!["container", "--root", root.to_str().unwrap()];
    a.extend(args);
    let out = agent(&a);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn container_err(root: &Path, args: &[&str]) -> String {
    let mut a = vec!["container", "--root", root.to_str().unwrap()];
    a.extend(args);
    let out = agent(&a);
    assert!(!out.status.success(), "{args:?} succeeded");
    String::from_utf8(out.stderr).unwrap()
}

#[test]
fn containers_carry_labels_and_leave_mode_and_priority_to_the_policy() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("containers");
    let r = root.as_path();
    container_ok(
        r,
        &[
            "add",
            "--id",
            "c",
            "--gpu",
            GPU,
            "--sm-target",
            "30",
            "--namespace",
            "prod",
            "--label",
            "tier=inference",
            "--label",
            "app.kubernetes.io/part-of=shop",
        ],
    );
    let m = meta(r, "c");
    assert_eq!(m["labels"]["tier"], "inference");
    assert_eq!(m["labels"]["app.kubernetes.io/part-of"], "shop");
    // Not given: not written (the policy decides).
    assert!(
        m.get("mode").is_none() && m.get("priority").is_none(),
        "{m}"
    );

    container_ok(
        r,
        &[
            "set",
            "--id",
            "c",
            "--mode",
            "elastic",
            "--priority",
            "7",
            "--label",
            "tier-",
            "--label",
            "x=1",
        ],
    );
    let m = meta(r, "c");
    assert_eq!(
        (m["mode"].as_str(), m["priority"].as_u64()),
        (Some("elastic"), Some(7))
    );
    assert!(m["labels"].get("tier").is_none(), "{m}");
    assert_eq!(m["labels"]["x"], "1");
    let out = agent(&["container", "--root", r.to_str().unwrap(), "list"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("elastic"));

    // Back to the policy.
    container_ok(
        r,
        &[
            "set",
            "--id",
            "c",
            "--mode",
            "policy",
            "--priority",
            "policy",
        ],
    );
    let m = meta(r, "c");
    assert!(
        m.get("mode").is_none() && m.get("priority").is_none(),
        "{m}"
    );
    let out = agent(&["container", "--root", r.to_str().unwrap(), "list"]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("policy"), "{table}");

    // Bad labels and values are refused, naming what is accepted.
    for (args, says) in [
        (vec!["--label", "Bad Key=x"], "is not a label key"),
        (vec!["--label", "tier=-x"], "is not a label value"),
        (vec!["--label", "tier"], "neither key=value nor key-"),
        (vec!["--mode", "soft"], "or policy"),
        (vec!["--priority", "high"], "or policy"),
        (vec!["--priority", "101"], "priority"),
    ] {
        let mut a = vec!["set", "--id", "c"];
        a.extend(args.iter().copied());
        let e = container_err(r, &a);
        assert!(e.contains(says), "{a:?}: {e}");
    }
    let e = container_err(r, &["add", "--id", "d", "--gpu", GPU, "--label", "tier-"]);
    assert!(e.contains("add cannot"), "{e}");
    // The refusals changed nothing.
    assert_eq!(meta(r, "c")["labels"]["x"], "1");
}
