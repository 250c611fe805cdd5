//! Hot reload of the policy file as the daemon does it once per period
//! ([`Reloader::poll`]): judged by the files written here and the policy
//! that comes out, period by period.
#![allow(
    clippy::unwrap_used,
    reason = "test code unwraps; clippy only exempts #[test] functions themselves"
)]

use std::path::Path;

use tessera_agent::control::Mode;
use tessera_agent::policy::{Policy, Reloader};

const ELASTIC: &str = "apiVersion: tessera.dev/v1alpha1
kind: Policy
rules:
  - name: research
    match:
      namespaces: [research]
    computeMode: elastic
";

/// The same policy with `priority: 500` on line 8.
const BROKEN: &str = "apiVersion: tessera.dev/v1alpha1
kind: Policy
rules:
  - name: research
    match:
      namespaces: [research]
    computeMode: elastic
    priority: 500
";

const HARD: &str = "apiVersion: tessera.dev/v1alpha1
kind: Policy
defaults:
  priority: 5
";

fn research_mode(p: &Policy) -> Mode {
    p.rules
        .iter()
        .find(|r| r.matcher.namespaces.iter().any(|n| n == "research"))
        .and_then(|r| r.set.mode)
        .unwrap_or(p.defaults.mode)
}

/// Replaces `path` by a new file (a new inode, as editors and
/// `kubectl cp` do).
fn replace(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[test]
fn a_missing_default_file_is_the_built_in_policy_and_a_configured_one_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("policy.yaml");
    let mut policy = Policy::default();
    let mut r = Reloader::new(&path, false);
    assert!(!r.poll(&mut policy));
    let v = r.view(&policy);
    assert_eq!((v.file, v.loads, v.error), (None, 0, None));
    assert_eq!(policy, Policy::default());

    let mut r = Reloader::new(&path, true);
    r.poll(&mut policy);
    let e = r.view(&policy).error.unwrap();
    assert!(
        e.contains("does not exist") && e.contains(path.to_str().unwrap()),
        "{e}"
    );
    // It appears: applied at the next look.
    std::fs::write(&path, ELASTIC).unwrap();
    assert!(r.poll(&mut policy));
    let v = r.view(&policy);
    assert_eq!(
        (v.file.as_deref(), v.loads, v.error),
        (Some(path.as_path()), 1, None)
    );
    assert_eq!(v.rules, ["research"]);
}

#[test]
fn a_bad_file_keeps_the_previous_policy_until_it_is_fixed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("policy.yaml");
    std::fs::write(&path, ELASTIC).unwrap();
    let mut policy = Policy::default();
    let mut r = Reloader::new(&path, true);
    assert!(r.poll(&mut policy));
    assert_eq!(research_mode(&policy), Mode::Elastic);
    // Unchanged: not read again (nothing changes, however often).
    for _ in 0..3 {
        assert!(!r.poll(&mut policy));
    }
    assert_eq!(r.view(&policy).loads, 1);

    // Written in place (same inode): refused with file, line and field.
    std::fs::write(&path, BROKEN).unwrap();
    assert!(!r.poll(&mut policy));
    let v = r.view(&policy);
    let e = v.error.clone().unwrap();
    assert!(e.contains(path.to_str().unwrap()), "{e}");
    assert!(
        e.contains("line 8") && e.contains("rules[0].priority") && e.contains("0 to 100"),
        "{e}"
    );
    assert_eq!(
        research_mode(&policy),
        Mode::Elastic,
        "the previous policy stays"
    );
    assert_eq!((v.loads, v.file.as_deref()), (1, Some(path.as_path())));

    // Fixed: applied at the next look, the error gone.
    replace(&path, HARD);
    assert!(r.poll(&mut policy));
    let v = r.view(&policy);
    assert_eq!((v.loads, v.error), (2, None));
    assert_eq!(research_mode(&policy), Mode::Hard);
    assert_eq!(policy.defaults.priority, 5);
}

#[test]
fn a_deleted_file_keeps_the_policy_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("policy.yaml");
    std::fs::write(&path, ELASTIC).unwrap();
    let mut policy = Policy::default();
    // The default path: a missing file there would be no error at the
    // start, but a removed one that was in force is.
    let mut r = Reloader::new(&path, false);
    r.poll(&mut policy);
    std::fs::remove_file(&path).unwrap();
    assert!(!r.poll(&mut policy));
    let e = r.view(&policy).error.unwrap();
    assert!(
        e.contains("was removed") && e.contains("stays in force"),
        "{e}"
    );
    assert_eq!(research_mode(&policy), Mode::Elastic);
    // Back again (the same text): loaded again, the error gone.
    std::fs::write(&path, ELASTIC).unwrap();
    r.poll(&mut policy);
    let v = r.view(&policy);
    assert_eq!((v.loads, v.error), (2, None));
}

/// A ConfigMap volume: `policy.yaml -> ..data/policy.yaml`, `..data ->
/// ..<timestamp>`; an update writes a new timestamped directory and swaps
/// the `..data` symlink atomically. The file's own path never changes.
#[test]
fn a_configmap_symlink_swap_is_seen() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let v1 = d.join("..2026_01_01_00_00_00.1");
    let v2 = d.join("..2026_01_01_00_01_00.2");
    std::fs::create_dir(&v1).unwrap();
    std::fs::create_dir(&v2).unwrap();
    std::fs::write(v1.join("policy.yaml"), ELASTIC).unwrap();
    // Same size as ELASTIC: only the identity of the target tells them
    // apart.
    let same_size = ELASTIC.replace("elastic", "hard\n\n\n");
    assert_eq!(same_size.len(), ELASTIC.len());
    std::fs::write(v2.join("policy.yaml"), &same_size).unwrap();
    std::os::unix::fs::symlink(v1.file_name().unwrap(), d.join("..data")).unwrap();
    std::os::unix::fs::symlink("..data/policy.yaml", d.join("policy.yaml")).unwrap();

    let path = d.join("policy.yaml");
    let mut policy = Policy::default();
    let mut r = Reloader::new(&path, true);
    r.poll(&mut policy);
    assert_eq!(research_mode(&policy), Mode::Elastic);
    // The swap, as the kubelet does it: a new link renamed over `..data`.
    std::os::unix::fs::symlink(v2.file_name().unwrap(), d.join("..data_tmp")).unwrap();
    std::fs::rename(d.join("..data_tmp"), d.join("..data")).unwrap();
    assert!(r.poll(&mut policy));
    assert_eq!(research_mode(&policy), Mode::Hard);
    assert_eq!(r.view(&policy).loads, 2);
}

#[test]
fn a_directory_or_an_unreadable_path_is_reported_not_fatal() {
    let dir = tempfile::tempdir().unwrap();
    let mut policy = Policy::default();
    let mut r = Reloader::new(dir.path(), true);
    r.poll(&mut policy);
    let e = r.view(&policy).error.unwrap();
    assert!(e.contains("not a regular file"), "{e}");
    assert_eq!(policy, Policy::default());
    // A path through a file (ENOTDIR): reported, not a panic.
    let f = dir.path().join("f");
    std::fs::write(&f, "x").unwrap();
    let mut r = Reloader::new(&f.join("policy.yaml"), true);
    r.poll(&mut policy);
    assert!(r.view(&policy).error.is_some());
}
