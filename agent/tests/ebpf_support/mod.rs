//! Shared by the privileged eBPF tests: skip reasons, the built objects,
//! test cgroups, and re-running the test binary as a child process inside
//! a cgroup.
//!
//! A child is this test binary run again with `TESSERA_EBPF_CHILD=<role>`
//! and the test's exact name: the same test function then calls
//! [`child_role`] first and acts as the child. The child waits for "go" on
//! stdin, so the parent can move it into a cgroup (and register it) before
//! it touches a device.

// Each test file and benchmark that includes this module uses part of it.
#![allow(dead_code, unused_imports)]

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use tessera_agent::cgroup;
use tessera_agent::ebpf::{Device, DeviceSpec};

const CHILD_ENV: &str = "TESSERA_EBPF_CHILD";

pub use tessera_testkit::{or_skip, skip_if};

/// "not root" unless this process runs as root.
pub fn not_root() -> Option<String> {
    // /proc/self belongs to the effective uid.
    let euid = std::fs::metadata("/proc/self")
        .map(|m| m.uid())
        .unwrap_or(u32::MAX);
    (euid != 0).then(|| "not root".to_owned())
}

pub use tessera_testkit::programs::on_path;

/// Why this machine cannot run privileged eBPF tests, if it cannot.
pub fn skip_reason() -> Option<String> {
    not_root()
        .or_else(|| object().err())
        .or_else(|| cgroup::cgroup2_root().err().map(|e| e.to_string()))
}

/// `$TESSERA_ARTIFACTS`, the built objects and simulator.
pub fn artifacts() -> Result<PathBuf, String> {
    std::env::var_os("TESSERA_ARTIFACTS")
        .map(PathBuf::from)
        .ok_or_else(|| "TESSERA_ARTIFACTS is not set (run `cargo xtask test`)".to_owned())
}

/// `<dir>/<rel>`, or why it is missing.
pub fn artifact_in(dir: &Path, rel: &str) -> Result<PathBuf, String> {
    let path = dir.join(rel);
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!(
            "{} does not exist (run `cargo xtask build`)",
            path.display()
        ))
    }
}

/// `$TESSERA_ARTIFACTS/<rel>`, e.g. `ebpf/tessera.bpf.o`, or why it is
/// missing.
pub fn artifact(rel: &str) -> Result<PathBuf, String> {
    artifact_in(&artifacts()?, rel)
}

/// The observer object.
pub fn object() -> Result<PathBuf, String> {
    artifact("ebpf/tessera.bpf.o")
}

/// The device a spec such as `/dev/zero` or `control=/dev/null` names
/// (see `DeviceSpec`).
pub fn device(spec: &str) -> Device {
    spec.parse::<DeviceSpec>().unwrap().resolve().unwrap()
}

/// The devices `specs` name.
pub fn devices(specs: &[&str]) -> Vec<Device> {
    specs.iter().map(|s| device(s)).collect()
}

/// A fresh cgroup v2 directory, removed (with its children) on drop.
pub struct TestCgroup(pub PathBuf);

impl TestCgroup {
    /// `<cgroup2 root>/tessera-test-<pid>-<name>`.
    pub fn new(name: &str) -> Self {
        let root = cgroup::cgroup2_root().unwrap();
        Self::at(root.join(format!("tessera-test-{}-{name}", std::process::id())))
    }

    /// A cgroup at `dir` (its parent must exist).
    pub fn at(dir: PathBuf) -> Self {
        std::fs::create_dir(&dir).unwrap();
        Self(dir)
    }

    /// A child cgroup `name` of this one (removed by this one's drop).
    pub fn child(&self, name: &str) -> PathBuf {
        let dir = self.0.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// Its cgroup id.
    pub fn id(&self) -> u64 {
        cgroup::cgroup_id(&self.0).unwrap()
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        let mut dirs = Vec::new();
        collect_dirs(&self.0, &mut dirs);
        // Deepest first.
        dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
        for dir in dirs {
            let mut removed = false;
            for _ in 0..50 {
                if std::fs::remove_dir(&dir).is_ok() {
                    removed = true;
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            if !removed {
                eprintln!("warning: cannot remove test cgroup {}", dir.display());
            }
        }
    }
}

fn collect_dirs(dir: &Path, out: &mut Vec<PathBuf>) {
    out.push(dir.to_owned());
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                collect_dirs(&entry.path(), out);
            }
        }
    }
}

/// The child role of this process, after waiting for the parent's "go";
/// `None` in the parent.
pub fn child_role() -> Option<String> {
    let role = std::env::var(CHILD_ENV).ok()?;
    wait_line("go");
    Some(role)
}

/// In a child: waits for line `want` on stdin.
pub fn wait_line(want: &str) {
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    assert_eq!(line.trim(), want);
}

/// A child process waiting for "go".
pub struct Child(std::process::Child);

impl Child {
    /// Runs test `test_name` of this binary again as a child in `role`.
    pub fn spawn(test_name: &str, role: &str) -> Self {
        Self::spawn_with(test_name, role, &[])
    }

    /// As [`Child::spawn`], with extra environment.
    pub fn spawn_with(test_name: &str, role: &str, env: &[(&str, &str)]) -> Self {
        Self::spawn_wrapped(&[], test_name, role, env)
    }

    /// As [`Child::spawn_with`], run through `wrapper`: a program and its
    /// arguments (e.g. `unshare --mount`) that runs the command line
    /// following them.
    pub fn spawn_wrapped(
        wrapper: &[&str],
        test_name: &str,
        role: &str,
        env: &[(&str, &str)],
    ) -> Self {
        let exe = std::env::current_exe().unwrap();
        let mut cmd = match wrapper.split_first() {
            None => Command::new(&exe),
            Some((program, args)) => {
                let mut cmd = Command::new(program);
                cmd.args(args).arg(&exe);
                cmd
            }
        };
        cmd.args([test_name, "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, role)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        Self(cmd.spawn().unwrap())
    }

    /// Its pid (= tgid).
    pub fn pid(&self) -> u32 {
        self.0.id()
    }

    /// Moves it into cgroup directory `dir`.
    pub fn join(self, dir: &Path) -> Self {
        std::fs::write(dir.join("cgroup.procs"), self.pid().to_string()).unwrap();
        self
    }

    /// Lets it run until it answers (see [`answer`]); it then waits for
    /// [`Child::finish`].
    pub fn go_until_answer(&mut self) -> String {
        self.0.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
        let mut stdout = BufReader::new(self.0.stdout.as_mut().unwrap());
        let mut seen = String::new();
        loop {
            let mut line = String::new();
            if stdout.read_line(&mut line).unwrap() == 0 {
                panic!("child exited without answering: {seen:?}");
            }
            if let Some(a) = line.trim_end().strip_prefix(ANSWER) {
                return a.to_owned();
            }
            seen.push_str(&line);
        }
    }

    /// Tells a child stopped after its answer to exit, and waits for it.
    pub fn finish(mut self) {
        self.0.stdin.as_mut().unwrap().write_all(b"exit\n").unwrap();
        let status = self.0.wait().unwrap();
        assert!(status.success(), "child failed: {status}");
    }

    /// Sends "go" without waiting, to release several children at once;
    /// [`Child::go`] then waits for each.
    pub fn release(&mut self) {
        if let Some(mut stdin) = self.0.stdin.take() {
            stdin.write_all(b"go\n").unwrap();
        }
    }

    /// Lets it run (unless [`Child::release`]d already); waits for it and
    /// returns its stdout. Fails the test if the child failed.
    pub fn go(mut self) -> String {
        self.release();
        let out = self.0.wait_with_output().unwrap();
        let mut stderr = String::new();
        for line in BufReader::new(&out.stderr[..]).lines() {
            stderr.push_str(&line.unwrap());
            stderr.push('\n');
        }
        assert!(
            out.status.success(),
            "child failed: {}\n{stderr}",
            out.status
        );
        String::from_utf8(out.stdout).unwrap()
    }
}

/// Marks a child's answer on stdout, where libtest writes too.
pub const ANSWER: &str = "ANSWER:";

/// Prints a child's answer.
pub fn answer(text: &str) {
    println!("\n{ANSWER}{text}");
}

/// The answer in a child's stdout.
pub fn answer_in(stdout: &str) -> String {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix(ANSWER))
        .unwrap_or_else(|| panic!("no answer in child output: {stdout:?}"))
        .to_owned()
}

/// The raw ioctl children issue; the only unsafe code of the tests.
pub mod sys {
    /// NVIDIA's `_IOWR('F', nr, size)`: the command of frontend escape
    /// `nr` with a parameter block of `size` bytes.
    pub const fn iowr(nr: u32, size: usize) -> u64 {
        (3 << 30) | ((size as u64) << 16) | (0x46 << 8) | nr as u64
    }

    /// ioctl(fd, cmd, arg) on a device that rejects it (`/dev/zero`,
    /// `/dev/null` answer ENOTTY); the result is irrelevant.
    pub fn ioctl<T>(fd: &std::fs::File, cmd: u64, arg: &mut T) {
        use std::os::fd::AsRawFd;
        // SAFETY: `fd` is an open file and `arg` a live, writable value of
        // at least the size encoded in `cmd`; the memory drivers never
        // write through it anyway.
        unsafe { libc::ioctl(fd.as_raw_fd(), cmd as _, std::ptr::from_mut(arg)) };
    }

    /// A frontend escape `nr` with parameters `params`, the command
    /// encoding their size.
    pub fn escape<T>(fd: &std::fs::File, nr: u32, params: &mut T) {
        ioctl(fd, iowr(nr, size_of::<T>()), params);
    }
}
