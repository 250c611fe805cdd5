//! `cargo xtask demo`, run as a user runs it but with stdout a pipe: plain
//! lines (no escape codes), the summary judged by the simulator's record,
//! the exit status, and nothing left behind — no process started from its
//! temporary folder, no temporary folder, no cgroup — both when it runs to
//! its end and when SIGINT stops it midway. As root, its containers are
//! real cgroups holding the workload processes, named in their metadata.
//!
//! Needs the built artifacts (`cargo xtask build --no-ebpf`;
//! `TESSERA_ARTIFACTS` picks them, as for the other tests).
#![allow(clippy::unwrap_used)] // helpers of a test crate

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, kill_process};

const CONTAINERS: [&str; 6] = [
    "train-a", "serve-b", "batch-c", "greedy-d", "infer-e", "etl-f",
];

/// `xtask demo --seconds N` with `TMPDIR` inside `tmp`.
fn start(tmp: &Path, seconds: u64) -> Child {
    Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(["demo", "--seconds", &seconds.to_string(), "--artifacts"])
        .arg(tessera_testkit::sim::artifacts())
        .env("TMPDIR", tmp)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Collects `child`'s stdout line by line (sent to the channel as read)
/// and its stderr.
fn collect(child: &mut Child) -> (mpsc::Receiver<String>, std::thread::JoinHandle<String>) {
    let (tx, rx) = mpsc::channel();
    let out = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        let mut r = BufReader::new(out);
        let mut line = Vec::new();
        // Raw bytes: an escape code must reach the assertion, not be lost
        // to a UTF-8 error.
        while r.read_until(b'\n', &mut line).unwrap_or(0) > 0 {
            let _ = tx.send(String::from_utf8_lossy(&line).into_owned());
            line.clear();
        }
    });
    let err = child.stderr.take().unwrap();
    let stderr = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut BufReader::new(err), &mut s);
        s
    });
    (rx, stderr)
}

fn wait(child: &mut Child, timeout: Duration) -> ExitStatus {
    let end = Instant::now() + timeout;
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        if Instant::now() >= end {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the demo did not exit within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Processes whose command line mentions `dir` (the demo's workloads run
/// from its temporary folder; the agent's root is in it).
fn processes_under(dir: &Path) -> Vec<String> {
    let needle = dir.to_string_lossy().into_owned();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter_map(|e| {
            let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            cmd.contains(&needle)
                .then(|| format!("{}: {cmd}", e.file_name().to_string_lossy()))
        })
        .collect()
}

/// The cgroup folder the demo printed (`cgroups: one per container under
/// DIR`), or the reason it gave for running without.
fn cgroup_of(out: &str) -> Result<PathBuf, String> {
    let line = out
        .lines()
        .find(|l| l.starts_with("cgroups: "))
        .unwrap_or_else(|| panic!("no cgroups line in {out}"));
    match line.strip_prefix("cgroups: one per container under ") {
        Some(p) => Ok(PathBuf::from(p.trim())),
        None => Err(line.to_owned()),
    }
}

fn root() -> bool {
    rustix::process::geteuid().is_root()
}

/// Nothing of the run is left: no process, no file in `tmp`, no cgroup.
fn assert_nothing_left(tmp: &Path, out: &str) {
    // The demo reaps what it started before it exits; allow the kernel a
    // moment to drop /proc entries of processes reaped just now.
    let end = Instant::now() + Duration::from_secs(2);
    let mut left = processes_under(tmp);
    while !left.is_empty() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(50));
        left = processes_under(tmp);
    }
    assert!(left.is_empty(), "processes left behind: {left:#?}");
    let files: Vec<_> = std::fs::read_dir(tmp)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert!(files.is_empty(), "left in the temporary folder: {files:?}");
    if let Ok(cg) = cgroup_of(out) {
        assert!(!cg.exists(), "cgroup {} left behind", cg.display());
    }
}

/// Checks the plain output: no escape code, lines per container from the
/// agent's view, the summary naming every container.
fn assert_plain(out: &str) {
    assert!(
        !out.contains('\x1b'),
        "an escape code in plain output:\n{out}"
    );
    for c in CONTAINERS {
        assert!(
            out.lines()
                .any(|l| l.starts_with("t=") && l.contains(&format!(" container={c} "))),
            "no live line of {c}:\n{out}"
        );
        assert!(
            out.lines()
                .any(|l| l.starts_with(&format!("  {c} ")) && l.contains("memory peak")),
            "no memory verdict of {c}:\n{out}"
        );
    }
}

#[test]
fn the_demo_runs_to_its_end_judges_the_limits_and_leaves_nothing_behind() {
    let tmp = tempfile::tempdir().unwrap();
    let mut child = start(tmp.path(), 14);
    let (rx, stderr) = collect(&mut child);
    let status = wait(&mut child, Duration::from_secs(180));
    let out: String = rx.iter().collect();
    let err = stderr.join().unwrap();
    assert!(status.success(), "{status}:\n{out}\n{err}");
    assert_plain(&out);
    assert!(out.contains("limits held: yes"), "{out}");
    // The live change went through the agent: its view shows the new
    // target, and the simulator's record shows serve-b held to it.
    assert!(
        out.lines()
            .any(|l| l.contains(" container=serve-b ") && l.contains(" target=40 ")),
        "{out}"
    );
    let after = out
        .lines()
        .find(|l| l.starts_with("  serve-b ") && l.contains("(target  40,"))
        .unwrap_or_else(|| panic!("no verdict on serve-b after the change:\n{out}"));
    assert!(after.contains(": held, converged"), "{after}\n{out}");
    // The allocation past greedy-d's limit was refused.
    assert!(
        out.lines().any(|l| l.starts_with("  greedy-d ")
            && l.contains("refused")
            && l.contains("CUDA_ERROR_OUT_OF_MEMORY")),
        "{out}"
    );
    match cgroup_of(&out) {
        Ok(_) => assert!(root()),
        Err(why) => {
            assert!(!root(), "root, but {why}");
            println!("skipped: the cgroup part (not root): {why}");
        }
    }
    assert_nothing_left(tmp.path(), &out);
}

#[test]
fn sigint_midway_stops_the_workloads_and_the_agent_and_removes_everything() {
    let tmp = tempfile::tempdir().unwrap();
    let mut child = start(tmp.path(), 120);
    let (rx, stderr) = collect(&mut child);
    let mut out = String::new();
    // Running: the agent lists every container in its view.
    let end = Instant::now() + Duration::from_secs(120);
    while !CONTAINERS.iter().all(|c| {
        out.lines()
            .any(|l| l.contains(&format!(" container={c} ")) && l.contains(" state=running "))
    }) {
        let left = end.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(l) => out.push_str(&l),
            Err(e) => panic!("the demo did not get running ({e}):\n{out}"),
        }
    }
    if let Ok(cg) = cgroup_of(&out) {
        // Real cgroups holding the workloads, named in the metadata.
        for c in CONTAINERS {
            let procs = std::fs::read_to_string(cg.join(c).join("cgroup.procs")).unwrap();
            assert_eq!(procs.lines().count(), 1, "{c}: {procs:?}");
            let meta = std::fs::read_dir(tmp.path())
                .unwrap()
                .map(|e| {
                    e.unwrap()
                        .path()
                        .join("containers")
                        .join(c)
                        .join("meta.json")
                })
                .find(|p| p.is_file())
                .unwrap_or_else(|| panic!("no meta.json of {c}"));
            let meta: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(&meta).unwrap()).unwrap();
            let rel = meta["cgroup"].as_str().unwrap();
            assert!(
                cg.join(c).ends_with(rel.trim_start_matches('/')),
                "{c}: {rel} is not {}",
                cg.join(c).display()
            );
        }
    } else {
        println!("skipped: the cgroup part (not root)");
    }
    assert!(!processes_under(tmp.path()).is_empty());
    kill_process(Pid::from_raw(child.id() as i32).unwrap(), Signal::INT).unwrap();
    let status = wait(&mut child, Duration::from_secs(60));
    out.extend(rx.iter());
    let err = stderr.join().unwrap();
    assert!(status.success(), "{status}:\n{out}\n{err}");
    assert_plain(&out);
    assert!(out.contains("stopped by a signal"), "{out}");
    assert!(out.contains("limits held: yes"), "{out}");
    assert_nothing_left(tmp.path(), &out);
}
