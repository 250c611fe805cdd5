//! Python environments under `target/` for tests that run real CUDA
//! software (CuPy, pynvml, PyTorch) on the simulated node, and a script
//! that stops at each step while the test reads the node's record.
//!
//! An environment is a virtual environment pip makes once, on first use,
//! in `target/<dir>`: made beside its place and renamed into it, remade
//! when its pinned requirements change, made by one test process at a
//! time (a lock file in `target/`). Where it cannot be made (no Python,
//! no package index) the caller skips with the reason.

use std::io::{BufRead, BufReader, Lines, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Mutex;

use crate::sim::workspace;

/// A Python environment: its folder under `target/` and what pip puts in it.
#[derive(Debug)]
pub struct PyEnv {
    pub dir: &'static str,
    pub requirements: &'static [&'static str],
}

/// CuPy for CUDA 12 with NVIDIA's 12.9 runtime and NVRTC.
pub const CUPY_CUDA12: PyEnv = PyEnv {
    dir: "pyenv-cuda",
    requirements: &[
        "cupy-cuda12x==14.2.0",
        "nvidia-cuda-runtime-cu12==12.9.79",
        "nvidia-cuda-nvrtc-cu12==12.9.86",
    ],
};

/// CuPy for CUDA 13 with NVIDIA's 13.5 runtime and NVRTC.
pub const CUPY_CUDA13: PyEnv = PyEnv {
    dir: "pyenv-cuda13",
    requirements: &[
        "cupy-cuda13x==14.2.0",
        "nvidia-cuda-runtime==13.5.37",
        "nvidia-cuda-nvrtc==13.5.37",
    ],
};

/// NVIDIA's Python bindings of NVML (`import pynvml`).
pub const NVML: PyEnv = PyEnv {
    dir: "pyenv-nvml",
    requirements: &["nvidia-ml-py==13.615.71"],
};

/// PyTorch's CUDA build from PyPI with the NVIDIA wheels it pulls (about
/// 5 GiB installed).
pub const TORCH: PyEnv = PyEnv {
    dir: "pyenv-torch",
    requirements: &["torch==2.15.0"],
};

/// The environment's Python, made on first use (see the module docs).
pub fn python(env: &PyEnv) -> Result<PathBuf, String> {
    static MADE: Mutex<Vec<(&'static str, Result<PathBuf, String>)>> = Mutex::new(Vec::new());
    let mut made = MADE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, r)) = made.iter().find(|(d, _)| *d == env.dir) {
        return r.clone();
    }
    let r = make(env);
    made.push((env.dir, r.clone()));
    r
}

fn make(env: &PyEnv) -> Result<PathBuf, String> {
    let target = workspace().join("target");
    std::fs::create_dir_all(&target).map_err(|e| format!("{}: {e}", target.display()))?;
    // One maker at a time across test processes.
    let lock = std::fs::File::create(target.join(format!("{}.lock", env.dir)))
        .map_err(|e| format!("the lock of {}: {e}", env.dir))?;
    lock.lock()
        .map_err(|e| format!("the lock of {}: {e}", env.dir))?;
    let dir = target.join(env.dir);
    let stamp = env.requirements.join("\n");
    let python = dir.join("bin/python");
    if std::fs::read_to_string(dir.join("tessera-stamp"))
        .ok()
        .as_deref()
        == Some(&stamp)
        && python.is_file()
    {
        return Ok(python);
    }
    let tmp = target.join(format!("{}.tmp-{}", env.dir, std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    run(Command::new("python3").args(["-m", "venv"]).arg(&tmp))
        .map_err(|e| format!("no Python virtual environment for {}: {e}", env.dir))?;
    let started = std::time::Instant::now();
    let installed = run(Command::new(tmp.join("bin/python"))
        .args(["-m", "pip", "install", "--quiet"])
        .arg("--disable-pip-version-check")
        .args(env.requirements));
    if let Err(e) = installed {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(format!(
            "pip could not install {}: {e}",
            env.requirements.join(", ")
        ));
    }
    eprintln!(
        "made {} in {:.0?} (pip: {})",
        dir.display(),
        started.elapsed(),
        env.requirements.join(", ")
    );
    std::fs::write(tmp.join("tessera-stamp"), &stamp).map_err(|e| e.to_string())?;
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::rename(&tmp, &dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok(python)
}

fn run(c: &mut Command) -> Result<(), String> {
    let out = c.output().map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        let err = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = err.lines().rev().take(5).collect();
        Err(format!(
            "{}: {}",
            out.status,
            tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
        ))
    }
}

/// A script run in steps: each step prints `step <name> <json>` and waits
/// for a line on stdin, so the test reads the node's record while the
/// process holds what the step made. The script ends with a line `end`.
pub struct Steps {
    pub child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
    stderr: PathBuf,
    scenario: String,
}

impl Steps {
    /// Starts `c` (a Python) with `script` and `scenario`, its stderr
    /// kept in `dir`.
    pub fn start(mut c: Command, dir: &Path, script: &Path, scenario: &str) -> Self {
        let stderr = dir.join(format!("{scenario}.stderr"));
        let mut child = c
            .arg(script)
            .arg(scenario)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr).expect("stderr file"))
            .spawn()
            .expect("start python");
        let stdin = child.stdin.take().expect("stdin");
        let lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        Self {
            child,
            stdin,
            lines,
            stderr,
            scenario: scenario.into(),
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// What the script printed on stderr so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// The next line the script prints, if any.
    pub fn next_line(&mut self) -> Option<String> {
        self.lines.next().and_then(Result::ok)
    }

    /// Waits for step `name` and returns its values as JSON text (the
    /// process then waits until [`Steps::go_on`]).
    pub fn at(&mut self, name: &str) -> String {
        let Some(line) = self.next_line() else {
            let status = self.child.wait();
            panic!(
                "{}: ended before step {name} ({status:?}); stderr:\n{}",
                self.scenario,
                self.stderr()
            );
        };
        line.strip_prefix("step ")
            .and_then(|r| r.strip_prefix(name))
            .unwrap_or_else(|| panic!("{}: expected step {name}, got {line:?}", self.scenario))
            .trim()
            .to_string()
    }

    /// Lets the script go on from its step.
    pub fn go_on(&mut self) {
        writeln!(self.stdin).expect("resume the script");
        self.stdin.flush().expect("flush");
    }

    /// Lets the script finish; checks it ended well and returns its
    /// stderr, printing the driver's `gpusim:` lines (the gaps it logged).
    pub fn finish(mut self) -> String {
        self.go_on();
        let end = self.next_line();
        // A step the test did not wait for: fail rather than wait for an
        // end that never comes (dropping `self` kills the script).
        if let Some(step) = end.as_deref().filter(|l| l.starts_with("step ")) {
            panic!("{}: finished at {step:?}, not at its end", self.scenario);
        }
        let status = self.child.wait().expect("wait");
        let stderr = self.stderr();
        assert!(
            status.success() && end.as_deref() == Some("end"),
            "{}: {status}, last line {end:?}; stderr:\n{stderr}",
            self.scenario
        );
        for l in stderr.lines().filter(|l| l.starts_with("gpusim:")) {
            println!("{}: {l}", self.scenario);
        }
        stderr
    }
}

impl Drop for Steps {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
