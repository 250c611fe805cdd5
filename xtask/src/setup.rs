//! `cargo xtask setup`: installs what the build needs beyond stable Rust.
//!
//! - a nightly toolchain with `rust-src`, `rustfmt` and `clippy` (the eBPF
//!   programs build for `bpfel-unknown-none` with `-Z build-std=core`);
//!   where rustup cannot install one (refused, offline), the stable
//!   toolchain with `rust-src` instead, whose cargo and rustc accept the
//!   unstable flags under `RUSTC_BOOTSTRAP=1` ([`Tools::command`] sets it
//!   for any toolchain that is not a nightly);
//! - `bpf-linker`, built against that toolchain's own `libLLVM` and kept
//!   under `target/tools/`, one folder per LLVM build, so a toolchain update
//!   never leaves a linker behind that loads the wrong LLVM;
//! - the Debian packages the tests use (`strace`, `prometheus`, `curl`, …), as root
//!   only;
//! - the Python packages the chart tests use, and NVIDIA's C headers for
//!   the ABI check ([`crate::headers`]).
//!
//! Every step checks first and prints what it found or did, so a second run
//! is a fast no-op. [`ensure`] is the cheap check the other commands call.
//!
//! The toolchain is chosen the same way by setup and by [`ensure`] (build,
//! test): `TESSERA_NIGHTLY` if set (any rustup toolchain name:
//! `TESSERA_NIGHTLY=stable` forces the stable path), else an installed
//! `nightly`, else the newest installed dated nightly, else `stable`.
//! Setup installs `nightly` when there is none, and takes `stable` only
//! when that install fails.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::files::replace_symlink;
use crate::sh::{self, workspace_root};

/// The bpf-linker release line that works with aya 0.14 and LLVM 21–23.
const BPF_LINKER_VERSION: &str = "~0.13";
/// Prefix of `bpf-linker --version` for that line.
const BPF_LINKER_VERSION_PREFIX: &str = "bpf-linker 0.13.";
/// LLVM majors bpf-linker 0.13 has a cargo feature for.
const LLVM_MAJORS: std::ops::RangeInclusive<u32> = 21..=23;
/// Nightly components the eBPF build, format check and lint need.
const COMPONENTS: [(&str, &str); 3] = [
    ("rust-src", "lib/rustlib/src/rust/library/core/Cargo.toml"),
    ("rustfmt", "bin/rustfmt"),
    ("clippy", "bin/cargo-clippy"),
];
/// Debian packages the tests need: strace counts the simulator's ioctls;
/// gcc and libc6-dev link bpf-linker and build the tests' C clients (e.g.
/// `agent/tests/ebpf_gpusim`); prometheus (its `prometheus` server and
/// `promtool`) checks and scrapes the agent's `/metrics`
/// (`agent/tests/metrics_*.rs`). On a systemd host the package also starts
/// a prometheus service on :9090; the tests never use fixed ports. curl is
/// what the gpu bundle's `controller.sh` polls the agent with
/// (`agent/tests/bundle_controller.rs` runs it), and `cargo xtask cluster`
/// checks its components' health with it. libseccomp-dev and pkg-config
/// build the cluster's runc with seccomp (containerd gives every pod
/// sandbox a seccomp profile, which a runc without it refuses).
/// busybox-static is the shell and file tools of the agent image
/// (`cargo xtask images`), for the chart's preload init step.
const PACKAGES: [&str; 8] = [
    "strace",
    "gcc",
    "libc6-dev",
    "prometheus",
    "curl",
    "libseccomp-dev",
    "pkg-config",
    "busybox-static",
];
/// Environment variable naming the toolchain of the eBPF build (a nightly,
/// or `stable` for the fallback); setup, build and test all read it.
pub const NIGHTLY_ENV: &str = "TESSERA_NIGHTLY";
/// The toolchain setup falls back to when no nightly can be installed.
const FALLBACK_TOOLCHAIN: &str = "stable";

#[derive(clap::Args, Clone, Debug, Default)]
pub struct Args {
    /// Do not install Debian or Python packages.
    #[arg(long)]
    pub no_packages: bool,
}

/// The nightly named by [`NIGHTLY_ENV`], if any.
fn requested_nightly() -> Option<String> {
    std::env::var(NIGHTLY_ENV)
        .ok()
        .filter(|name| !name.is_empty())
}

/// What the eBPF build needs, found by [`ensure`].
#[derive(Clone, Debug)]
pub struct Tools {
    /// rustup toolchain name for `rustup run`, e.g. `nightly` or `stable`.
    pub toolchain: String,
    /// Whether that toolchain is a nightly; when not, its commands run
    /// with `RUSTC_BOOTSTRAP=1`.
    pub is_nightly: bool,
    /// The bpf-linker binary, linked against the toolchain's `libLLVM`.
    pub bpf_linker: PathBuf,
}

impl Tools {
    fn new(toolchain: String, bpf_linker: PathBuf) -> Result<Self> {
        let is_nightly = is_nightly_toolchain(&toolchain)?;
        if !is_nightly {
            eprintln!(
                "note: the eBPF programs build with toolchain `{toolchain}`, not a nightly, \
                 under RUSTC_BOOTSTRAP=1"
            );
        }
        Ok(Self {
            toolchain,
            is_nightly,
            bpf_linker,
        })
    }

    /// `rustup run <toolchain> <program>` with the environment of the outer
    /// cargo removed, so nothing leaks into the eBPF build; with
    /// `RUSTC_BOOTSTRAP=1` when the toolchain is not a nightly (the
    /// programs need `-Z build-std` and `asm_experimental_arch`).
    pub fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new("rustup");
        cmd.args(["run", &self.toolchain, program]);
        if self.is_nightly {
            cmd.env_remove("RUSTC_BOOTSTRAP");
        } else {
            cmd.env("RUSTC_BOOTSTRAP", "1");
        }
        for var in [
            "RUSTUP_TOOLCHAIN",
            "RUSTC",
            "RUSTDOC",
            "RUSTC_WRAPPER",
            "RUSTC_WORKSPACE_WRAPPER",
            "RUSTFLAGS",
            "CARGO_ENCODED_RUSTFLAGS",
            "CARGO_TARGET_DIR",
            "CARGO_BUILD_TARGET",
            "CARGO",
        ] {
            cmd.env_remove(var);
        }
        let linker_dir = self
            .bpf_linker
            .parent()
            .expect("bpf-linker path has a parent");
        let path = std::env::var_os("PATH").unwrap_or_default();
        let joined = std::env::join_paths(
            std::iter::once(linker_dir.to_path_buf()).chain(std::env::split_paths(&path)),
        )
        .expect("PATH entries contain no separator");
        cmd.env("PATH", joined);
        cmd
    }
}

/// `cargo xtask setup`; returns the tools it installed or found, as
/// [`ensure`] would.
pub fn run(args: &Args) -> Result<Tools> {
    let toolchain = install_toolchain(requested_nightly().as_deref())?;
    let sysroot = sysroot(&toolchain)?;
    install_components(&toolchain, &sysroot)?;
    let llvm = LlvmLib::find(&sysroot)?;
    install_bpf_linker(&llvm)?;
    if args.no_packages {
        eprintln!("skip: debian and python packages (--no-packages)");
    } else {
        install_packages()?;
        install_python_packages()?;
        crate::headers::install()?;
    }
    Tools::new(toolchain, llvm.linker_path())
}

/// Python packages the tests use, as (distribution, pinned version): the
/// Helm 4 SDK, which renders and lints the chart, and kubernetes-validate,
/// whose Kubernetes JSON schemas (1.34) every rendered object is checked
/// against (`xtask/testkit/helm_check.py`, used by `plugin/tests/chart.rs`
/// and `agent/tests/chart_agent.rs`).
const PYTHON_PACKAGES: [(&str, &str); 2] = [
    ("helm-python-sdk", "0.2.2"),
    ("kubernetes-validate", "1.34.1"),
];

fn install_python_packages() -> Result<()> {
    let Some(python) = sh::on_path("python3") else {
        eprintln!("skip: python packages (no python3 on PATH); the chart tests will skip");
        return Ok(());
    };
    for (distribution, version) in PYTHON_PACKAGES {
        let requirement = format!("{distribution}=={version}");
        // Present means installed at exactly the pinned version.
        let check = format!(
            "import importlib.metadata as m, sys; sys.exit(m.version({distribution:?}) != {version:?})"
        );
        let present = Command::new(&python)
            .args(["-c", &check])
            .output()
            .is_ok_and(|o| o.status.success());
        if present {
            eprintln!("ok: python package {requirement} already present");
            continue;
        }
        sh::run(Command::new(&python).args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            &requirement,
        ]))
        .with_context(|| format!("cannot install python package {requirement} (pip)"))?;
        eprintln!("installed: python package {requirement}");
    }
    Ok(())
}

/// Checks that setup is done and returns the tools; installs nothing.
pub fn ensure() -> Result<Tools> {
    let nightly = match requested_nightly() {
        Some(name) => name,
        None => find_nightly()?.unwrap_or_else(|| FALLBACK_TOOLCHAIN.to_owned()),
    };
    let sysroot = sysroot(&nightly)
        .with_context(|| format!("toolchain `{nightly}` is not usable: run `cargo xtask setup`"))?;
    for (component, marker) in COMPONENTS {
        if !sysroot.join(marker).exists() {
            bail!(
                "component {component} is missing from toolchain `{nightly}`: run `cargo xtask setup` \
                 (or `rustup component add {component} --toolchain {nightly}`)"
            );
        }
    }
    let llvm = LlvmLib::find(&sysroot)?;
    let bpf_linker = llvm.linker_path();
    if !linker_works(&bpf_linker) {
        bail!(
            "bpf-linker for LLVM {} is missing or broken at {}: run `cargo xtask setup`",
            llvm.suffix,
            bpf_linker.display()
        );
    }
    Tools::new(nightly, bpf_linker)
}

/// Picks or installs the toolchain of the eBPF build and returns its
/// rustup name: the requested one, else an installed nightly, else a newly
/// installed `nightly`, else (that install failed) [`FALLBACK_TOOLCHAIN`].
fn install_toolchain(requested: Option<&str>) -> Result<String> {
    let name = match requested {
        Some(name) if sysroot(name).is_ok() => {
            eprintln!("ok: toolchain `{name}` (from {NIGHTLY_ENV}) already present");
            return Ok(name.to_owned());
        }
        Some(name) => name.to_owned(),
        None => match find_nightly()? {
            Some(name) => {
                eprintln!("ok: nightly toolchain `{name}` already present");
                return Ok(name);
            }
            None => "nightly".to_owned(),
        },
    };
    let components = COMPONENTS.map(|(c, _)| c).join(",");
    let installed = sh::run(Command::new("rustup").args([
        "toolchain",
        "install",
        &name,
        "--profile",
        "minimal",
        "--component",
        &components,
    ]))
    .with_context(|| format!("cannot install rust toolchain `{name}`"));
    match installed {
        Ok(()) => {
            eprintln!("installed: toolchain `{name}`");
            Ok(name)
        }
        // A toolchain asked for by name is not replaced by another.
        Err(e) if requested.is_some() => Err(e),
        Err(e) => {
            eprintln!(
                "warning: {e:#}; falling back to toolchain `{FALLBACK_TOOLCHAIN}` with rust-src \
                 and RUSTC_BOOTSTRAP=1 for the eBPF programs"
            );
            sysroot(FALLBACK_TOOLCHAIN).with_context(|| {
                format!("cannot use toolchain `{FALLBACK_TOOLCHAIN}` either (rustup run {FALLBACK_TOOLCHAIN} rustc fails)")
            })?;
            Ok(FALLBACK_TOOLCHAIN.to_owned())
        }
    }
}

/// Whether `toolchain` is a nightly (or a local dev build), read from its
/// `rustc --version`: only those accept unstable flags without
/// `RUSTC_BOOTSTRAP`.
fn is_nightly_toolchain(toolchain: &str) -> Result<bool> {
    let version = sh::output(
        Command::new("rustup")
            .args(["run", toolchain, "rustc", "--version"])
            .env_remove("RUSTUP_TOOLCHAIN")
            .env_remove("RUSTC_BOOTSTRAP"),
    )
    .with_context(|| format!("cannot read the version of toolchain `{toolchain}`"))?;
    Ok(version_is_nightly(&version))
}

fn version_is_nightly(version: &str) -> bool {
    // e.g. `rustc 1.97.0-nightly (e50aa6fba 2026-05-19)`, `rustc 1.95.0 (...)`.
    version
        .split_whitespace()
        .nth(1)
        .is_some_and(|v| v.ends_with("-nightly") || v.ends_with("-dev"))
}

/// The installed nightly to use: `nightly` itself, else the newest dated one.
fn find_nightly() -> Result<Option<String>> {
    let list = sh::output(Command::new("rustup").args(["toolchain", "list"]))
        .context("cannot list rust toolchains: is rustup installed?")?;
    Ok(pick_nightly(&list))
}

fn pick_nightly(list: &str) -> Option<String> {
    let names: Vec<&str> = list
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with("nightly"))
        .collect();
    // Undated: `nightly-<host>`; dated: `nightly-YYYY-MM-DD-<host>`.
    let is_dated = |n: &str| {
        n.strip_prefix("nightly-").is_some_and(|rest| {
            rest.len() > 10 && rest.as_bytes()[..4].iter().all(u8::is_ascii_digit)
        })
    };
    if names.iter().any(|n| !is_dated(n)) {
        return Some("nightly".to_owned());
    }
    names.into_iter().max().map(str::to_owned)
}

fn sysroot(toolchain: &str) -> Result<PathBuf> {
    let out = sh::output(
        Command::new("rustup")
            .args(["run", toolchain, "rustc", "--print", "sysroot"])
            .env_remove("RUSTUP_TOOLCHAIN"),
    )?;
    Ok(PathBuf::from(out.trim()))
}

fn install_components(toolchain: &str, sysroot: &Path) -> Result<()> {
    let missing: Vec<&str> = COMPONENTS
        .iter()
        .filter(|(_, marker)| !sysroot.join(marker).exists())
        .map(|(c, _)| *c)
        .collect();
    if missing.is_empty() {
        eprintln!(
            "ok: components {} on `{toolchain}` already present",
            COMPONENTS.map(|(c, _)| c).join(", ")
        );
        return Ok(());
    }
    sh::run(
        Command::new("rustup")
            .args(["component", "add", "--toolchain", toolchain])
            .args(&missing),
    )
    .with_context(|| {
        format!(
            "cannot add {} to toolchain `{toolchain}`",
            missing.join(", ")
        )
    })?;
    eprintln!("installed: {} on `{toolchain}`", missing.join(", "));
    Ok(())
}

/// The `libLLVM` shipped inside a toolchain's sysroot.
#[derive(Debug)]
struct LlvmLib {
    /// e.g. `.../lib/libLLVM.so.22.1-rust-1.97.0-nightly`
    path: PathBuf,
    /// e.g. `22.1-rust-1.97.0-nightly`
    suffix: String,
    major: u32,
}

impl LlvmLib {
    fn find(sysroot: &Path) -> Result<Self> {
        let lib = sysroot.join("lib");
        let entries = fs::read_dir(&lib)
            .with_context(|| format!("cannot read toolchain library folder {}", lib.display()))?;
        for entry in entries {
            let entry = entry.with_context(|| {
                format!("cannot read toolchain library folder {}", lib.display())
            })?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some(suffix) = name.strip_prefix("libLLVM.so.") {
                let major = parse_llvm_major(suffix)
                    .with_context(|| format!("cannot read the LLVM version from {name}"))?;
                return Ok(Self {
                    path: entry.path(),
                    suffix: suffix.to_owned(),
                    major,
                });
            }
        }
        bail!(
            "no libLLVM.so.* in {}: this toolchain cannot host bpf-linker; set {NIGHTLY_ENV} to a rustup toolchain (a nightly, or stable)",
            lib.display()
        )
    }

    /// Folder for this LLVM build's linker and its `LLVM_PREFIX`.
    fn tools_dir(&self) -> PathBuf {
        workspace_root()
            .join("target/tools")
            .join(format!("bpf-linker-0.13-llvm-{}", self.suffix))
    }

    fn linker_path(&self) -> PathBuf {
        self.tools_dir().join("bin/bpf-linker")
    }
}

fn parse_llvm_major(suffix: &str) -> Option<u32> {
    let digits: String = suffix.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

fn linker_works(path: &Path) -> bool {
    path.is_file()
        && sh::output(Command::new(path).arg("--version"))
            .is_ok_and(|v| v.trim_start().starts_with(BPF_LINKER_VERSION_PREFIX))
}

fn install_bpf_linker(llvm: &LlvmLib) -> Result<()> {
    let linker = llvm.linker_path();
    if linker_works(&linker) {
        eprintln!(
            "ok: bpf-linker for LLVM {} already present at {}",
            llvm.suffix,
            linker.display()
        );
        return Ok(());
    }
    if !LLVM_MAJORS.contains(&llvm.major) {
        bail!(
            "bpf-linker 0.13 supports LLVM {}..={}, but the toolchain ships LLVM {}: \
             set {NIGHTLY_ENV} to a toolchain with a supported LLVM",
            LLVM_MAJORS.start(),
            LLVM_MAJORS.end(),
            llvm.major
        );
    }
    // bpf-linker links `-lLLVM` from `$LLVM_PREFIX/lib` and records that
    // folder as its rpath; the folder holds links to the toolchain's library.
    let dir = llvm.tools_dir();
    let prefix_lib = dir.join("llvm/lib");
    fs::create_dir_all(&prefix_lib)
        .with_context(|| format!("cannot create {}", prefix_lib.display()))?;
    let versioned = llvm.path.file_name().expect("libLLVM path has a file name");
    for link in [prefix_lib.join("libLLVM.so"), prefix_lib.join(versioned)] {
        replace_symlink(&llvm.path, &link)?;
    }
    let feature = format!("llvm-{}", llvm.major);
    sh::run(
        sh::cargo()
            .args([
                "install",
                "bpf-linker",
                "--version",
                BPF_LINKER_VERSION,
                "--locked",
                "--force",
                "--no-default-features",
                "--features",
                &feature,
                "--root",
            ])
            .arg(&dir)
            .env("LLVM_PREFIX", dir.join("llvm"))
            .env_remove("RUSTFLAGS")
            .env_remove("CARGO_TARGET_DIR"),
    )
    .context("cannot build bpf-linker")?;
    if !linker_works(&linker) {
        bail!(
            "bpf-linker was built but {} --version fails",
            linker.display()
        );
    }
    eprintln!(
        "installed: bpf-linker for LLVM {} at {}",
        llvm.suffix,
        linker.display()
    );
    Ok(())
}

fn install_packages() -> Result<()> {
    if sh::on_path("dpkg").is_none() {
        eprintln!(
            "skip: debian packages (no dpkg on PATH); install by hand: {}",
            PACKAGES.join(" ")
        );
        return Ok(());
    }
    let missing: Vec<&str> = PACKAGES
        .into_iter()
        .filter(|p| !package_installed(p))
        .collect();
    if missing.is_empty() {
        eprintln!(
            "ok: debian packages {} already present",
            PACKAGES.join(", ")
        );
        return Ok(());
    }
    if !sh::is_root() {
        eprintln!(
            "skip: debian packages {} are missing but this is not root; run: sudo apt-get install {}",
            missing.join(", "),
            missing.join(" ")
        );
        return Ok(());
    }
    sh::run(
        Command::new("apt-get")
            .arg("update")
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
    .context("cannot update the apt package lists")?;
    sh::run(
        Command::new("apt-get")
            .args(["install", "-y", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
    .with_context(|| format!("cannot install debian packages {}", missing.join(", ")))?;
    eprintln!("installed: debian packages {}", missing.join(", "));
    Ok(())
}

fn package_installed(package: &str) -> bool {
    sh::output(Command::new("dpkg-query").args(["-W", "-f", "${Status}", package]))
        .is_ok_and(|s| s.trim() == "install ok installed")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefers_undated_nightly() {
        let list = "stable-x86_64-unknown-linux-gnu (active, default)\n\
                    nightly-2026-01-01-x86_64-unknown-linux-gnu\n\
                    nightly-x86_64-unknown-linux-gnu\n";
        assert_eq!(pick_nightly(list).as_deref(), Some("nightly"));
    }

    #[test]
    fn falls_back_to_newest_dated_nightly() {
        let list = "stable-x86_64-unknown-linux-gnu (active, default)\n\
                    nightly-2026-01-01-x86_64-unknown-linux-gnu\n\
                    nightly-2026-05-20-x86_64-unknown-linux-gnu\n";
        assert_eq!(
            pick_nightly(list).as_deref(),
            Some("nightly-2026-05-20-x86_64-unknown-linux-gnu")
        );
        assert_eq!(pick_nightly("stable-x86_64-unknown-linux-gnu\n"), None);
    }

    #[test]
    fn tells_nightly_from_stable() {
        assert!(version_is_nightly(
            "rustc 1.97.0-nightly (e50aa6fba 2026-05-19)\n"
        ));
        assert!(version_is_nightly("rustc 1.98.0-dev\n"));
        assert!(!version_is_nightly("rustc 1.95.0 (59807616e 2026-04-14)\n"));
        assert!(!version_is_nightly(
            "rustc 1.96.0-beta.3 (aaaaaaaaa 2026-05-01)\n"
        ));
        assert!(!version_is_nightly(""));
    }

    #[test]
    fn reads_llvm_major() {
        assert_eq!(parse_llvm_major("22.1-rust-1.97.0-nightly"), Some(22));
        assert_eq!(parse_llvm_major("rust-1.97.0"), None);
    }
}
