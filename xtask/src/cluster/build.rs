//! Building the cluster's programs from the Go modules under
//! `xtask/cluster/` into `target/cluster/bin/`, and its images into
//! `target/cluster/images/`.
//!
//! Each module is built when its inputs changed: a stamp beside the
//! programs holds a hash of the module's `go.mod`, `go.sum` and `.go`
//! files, the Go version and the build commands; with the programs
//! present and the stamp equal, nothing runs. Go's own cache (in
//! `go env GOCACHE`) makes a rebuild after a small change fast too.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};

use super::{Layout, PAUSE_IMAGE, PROBE_IMAGE};
use crate::files::replace_symlink;
use crate::sh::{self, workspace_root};

/// The Go toolchain: `go` on PATH, else the usual install location.
pub fn go_program() -> Option<PathBuf> {
    sh::on_path("go").or_else(|| {
        let usual = PathBuf::from("/usr/local/go/bin/go");
        usual.is_file().then_some(usual)
    })
}

/// What the cgo build of runc needs and this machine lacks, if anything.
pub fn missing_build_deps() -> Option<String> {
    if sh::on_path("gcc").is_none() {
        return Some("no gcc for runc's cgo build (`cargo xtask setup` installs it)".to_owned());
    }
    let seccomp = Command::new("pkg-config")
        .args(["--exists", "libseccomp"])
        .status()
        .is_ok_and(|s| s.success());
    if !seccomp {
        return Some(
            "no libseccomp-dev or pkg-config for runc's seccomp build (`cargo xtask setup` installs them, as root)"
                .to_owned(),
        );
    }
    None
}

/// One `go build` of a module.
struct GoBuild {
    /// Output: a file, or a folder (ending in `/`) for several packages.
    out: PathBuf,
    packages: &'static [&'static str],
    /// Build tags, comma-separated.
    tags: &'static str,
    cgo: bool,
    /// `-ldflags`.
    ldflags: String,
}

/// A Go module of the project and the builds it gives.
struct Module {
    /// Folder under `xtask/cluster/`.
    dir: &'static str,
    builds: Vec<GoBuild>,
    /// Files the builds must leave in `bin/`.
    outputs: Vec<PathBuf>,
}

fn modules(layout: &Layout) -> Result<Vec<Module>> {
    let bin = layout.bin();
    let kube_version = kubernetes_version()?;
    let cni = layout.cni_bin();
    // `-o DIR/` puts each package's program in DIR under its own name.
    let folder = |dir: &Path| {
        let mut s = dir.as_os_str().to_owned();
        s.push("/");
        PathBuf::from(s)
    };
    Ok(vec![
        Module {
            dir: "kube",
            builds: vec![GoBuild {
                out: bin.join("tessera-kube"),
                packages: &["."],
                tags: "",
                // The Go default (on where a C compiler is): what the cold
                // and warm times in the README were measured with.
                cgo: true,
                ldflags: version_ldflags(&kube_version),
            }],
            outputs: vec![bin.join("tessera-kube")],
        },
        Module {
            dir: "node",
            builds: vec![
                GoBuild {
                    out: folder(&bin),
                    packages: &[
                        "github.com/containerd/containerd/v2/cmd/containerd",
                        "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2",
                        "github.com/containerd/containerd/v2/cmd/ctr",
                        "./cmd/pause",
                        "./cmd/probe",
                        "./cmd/oci-image",
                        "./cmd/cluster-pki",
                        "./cmd/gpusim-container-runtime",
                        "./cmd/service-proxy",
                    ],
                    // Static programs; no btrfs or devmapper snapshotters
                    // (cgo and their C headers), as containerd's own
                    // static release build.
                    tags: "urfave_cli_no_docs,no_btrfs,no_devmapper,no_zfs,osusergo,netgo",
                    cgo: false,
                    ldflags: String::new(),
                },
                // runc's nsenter is C: cgo, with gcc. With seccomp
                // (libseccomp-dev and pkg-config, which setup installs):
                // containerd gives every pod sandbox a seccomp profile.
                // Without libpathrs (a Rust library): runc's Go fallback.
                GoBuild {
                    out: bin.join("runc"),
                    packages: &["github.com/opencontainers/runc"],
                    tags: "urfave_cli_no_docs,seccomp",
                    cgo: true,
                    ldflags: String::new(),
                },
                GoBuild {
                    out: folder(&cni),
                    packages: &[
                        "github.com/containernetworking/plugins/plugins/main/bridge",
                        "github.com/containernetworking/plugins/plugins/main/loopback",
                        "github.com/containernetworking/plugins/plugins/ipam/host-local",
                    ],
                    tags: "",
                    cgo: false,
                    ldflags: String::new(),
                },
            ],
            outputs: [
                "containerd",
                "containerd-shim-runc-v2",
                "ctr",
                "runc",
                "pause",
                "probe",
                "oci-image",
                "cluster-pki",
                "gpusim-container-runtime",
                "service-proxy",
            ]
            .iter()
            .map(|name| bin.join(name))
            .chain(
                ["bridge", "loopback", "host-local"]
                    .iter()
                    .map(|name| cni.join(name)),
            )
            .collect(),
        },
    ])
}

/// The version of `k8s.io/kubernetes` that `xtask/cluster/kube/go.mod`
/// requires, e.g. `v1.37.2`.
fn kubernetes_version() -> Result<String> {
    let path = workspace_root().join("xtask/cluster/kube/go.mod");
    let text =
        fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
    required_version(&text, "k8s.io/kubernetes")
        .with_context(|| format!("{} requires no k8s.io/kubernetes", path.display()))
}

fn required_version(go_mod: &str, module: &str) -> Option<String> {
    go_mod.lines().find_map(|line| {
        let mut words = line.trim().trim_start_matches("require").split_whitespace();
        (words.next()? == module).then(|| words.next().map(str::to_owned))?
    })
}

/// What upstream's build stamps into the binaries (`hack/lib/version.sh`):
/// without it they call themselves `v0.0.0-master`.
fn version_ldflags(version: &str) -> String {
    let (major, minor) = version
        .trim_start_matches('v')
        .split_once('.')
        .map(|(major, rest)| (major, rest.split('.').next().unwrap_or("0")))
        .unwrap_or(("0", "0"));
    ["k8s.io/component-base/version", "k8s.io/client-go/pkg/version"]
        .iter()
        .map(|pkg| {
            format!(
                "-X {pkg}.gitVersion={version} -X {pkg}.gitMajor={major} -X {pkg}.gitMinor={minor} -X {pkg}.gitTreeState=clean"
            )
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Builds what changed, then the images.
pub fn all(layout: &Layout) -> Result<()> {
    let go = go_program().context("no go toolchain to build the cluster with")?;
    if let Some(missing) = missing_build_deps() {
        bail!("cannot build the cluster: {missing}");
    }
    fs::create_dir_all(layout.cni_bin())
        .with_context(|| format!("cannot create {}", layout.cni_bin().display()))?;
    let version = sh::output(Command::new(&go).arg("version"))?;
    for module in modules(layout)? {
        build_module(&go, version.trim(), layout, &module)?;
    }
    replace_symlink("tessera-kube", &layout.bin().join("kubectl"))?;
    build_images(layout)
}

fn build_module(go: &Path, version: &str, layout: &Layout, module: &Module) -> Result<()> {
    let dir = workspace_root().join("xtask/cluster").join(module.dir);
    let mut hasher = Fnv::default();
    hasher.add(version.as_bytes());
    for build in &module.builds {
        hasher.add(
            format!(
                "{:?}{:?}{}{}",
                build.out, build.packages, build.tags, build.cgo
            )
            .as_bytes(),
        );
    }
    hash_sources(&dir, &dir, &mut hasher)?;
    let stamp = layout.bin().join(format!(".{}.stamp", module.dir));
    let digest = format!("{:016x}\n", hasher.0);
    let present = module.outputs.iter().all(|o| o.is_file());
    if present && fs::read_to_string(&stamp).is_ok_and(|s| s == digest) {
        eprintln!("ok: go module xtask/cluster/{} already built", module.dir);
        return Ok(());
    }
    let started = Instant::now();
    for build in &module.builds {
        let mut cmd = Command::new(go);
        cmd.current_dir(&dir)
            .args(["build", "-trimpath"])
            // Never fetch another Go toolchain.
            .env("GOTOOLCHAIN", "local")
            .env("CGO_ENABLED", if build.cgo { "1" } else { "0" });
        if !build.tags.is_empty() {
            cmd.args(["-tags", build.tags]);
        }
        if !build.ldflags.is_empty() {
            cmd.args(["-ldflags", &build.ldflags]);
        }
        cmd.arg("-o").arg(&build.out).args(build.packages);
        sh::run(&mut cmd)
            .with_context(|| format!("cannot build go module xtask/cluster/{}", module.dir))?;
    }
    if let Some(missing) = module.outputs.iter().find(|o| !o.is_file()) {
        bail!("the go build did not make {}", missing.display());
    }
    fs::write(&stamp, digest).with_context(|| format!("cannot write {}", stamp.display()))?;
    eprintln!(
        "built: go module xtask/cluster/{} in {:.0?}",
        module.dir,
        started.elapsed()
    );
    Ok(())
}

/// Feeds `go.mod`, `go.sum` and every `.go` file below `dir` (names and
/// contents, in name order) to `hasher`; stops at nested modules.
fn hash_sources(root: &Path, dir: &Path, hasher: &mut Fnv) -> Result<()> {
    let mut entries: Vec<_> = fs::read_dir(dir)
        .with_context(|| format!("cannot read {}", dir.display()))?
        .collect::<std::io::Result<_>>()
        .with_context(|| format!("cannot read {}", dir.display()))?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if entry.file_type()?.is_dir() {
            if !path.join("go.mod").exists() {
                hash_sources(root, &path, hasher)?;
            }
        } else if name.ends_with(".go") || name == "go.mod" || name == "go.sum" {
            let relative = path.strip_prefix(root).unwrap_or(&path);
            hasher.add(relative.to_string_lossy().as_bytes());
            hasher
                .add(&fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?);
        }
    }
    Ok(())
}

/// 64-bit FNV-1a: a hash that stays the same across Rust versions.
struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }

    /// One field: its bytes and a separator (0xff, in no UTF-8 text), so
    /// that moving bytes between fields changes the hash.
    fn add(&mut self, bytes: &[u8]) {
        self.write(bytes);
        self.write(&[0xff]);
    }
}

/// The images: (name, archive, program in `bin/`, its path in the image).
fn images(layout: &Layout) -> [(&'static str, PathBuf, PathBuf, &'static str); 2] {
    [
        (
            PAUSE_IMAGE,
            layout.images().join("pause.tar"),
            layout.bin().join("pause"),
            "/pause",
        ),
        (
            PROBE_IMAGE,
            layout.images().join("probe.tar"),
            layout.bin().join("probe"),
            "/probe",
        ),
    ]
}

/// Writes each image's archive (reproducible: the same program gives the
/// same archive).
fn build_images(layout: &Layout) -> Result<()> {
    fs::create_dir_all(layout.images())
        .with_context(|| format!("cannot create {}", layout.images().display()))?;
    for (name, archive, program, dest) in images(layout) {
        let mut add = program.into_os_string();
        add.push(format!("={dest}"));
        let out = sh::output(
            Command::new(layout.bin().join("oci-image"))
                .args(["--name", name, "--entrypoint", dest, "--out"])
                .arg(&archive)
                .arg("--add")
                .arg(add),
        )
        .with_context(|| format!("cannot make image {name}"))?;
        eprintln!("image: {}", out.trim());
    }
    Ok(())
}

/// Imports the images into containerd's `k8s.io` namespace, where the
/// CRI plugin finds them.
pub fn import_images(layout: &Layout) -> Result<()> {
    for (name, archive, _, _) in images(layout) {
        sh::output(layout.ctr().args(["images", "import"]).arg(&archive))
            .with_context(|| format!("cannot import image {name} into containerd"))?;
        eprintln!("imported: {name}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stamp_hash_is_stable_and_sees_every_byte() {
        // FNV-1a's published value for "a": a stamp written by one build
        // of xtask is read by the next.
        let mut fnv = Fnv::default();
        fnv.write(b"a");
        assert_eq!(fnv.0, 0xaf63_dc4c_8601_ec8c);
        let mut a = Fnv::default();
        a.add(b"go.mod");
        a.add(b"module x");
        let mut c = Fnv::default();
        c.add(b"go.mo");
        c.add(b"dmodule x");
        assert_ne!(a.0, c.0);
    }

    #[test]
    fn the_kubernetes_version_comes_from_go_mod() {
        let go_mod = "module x\n\nrequire (\n\tgo.etcd.io/etcd/server/v3 v3.7.0\n\tk8s.io/kubernetes v1.37.2\n)\n";
        assert_eq!(
            required_version(go_mod, "k8s.io/kubernetes").as_deref(),
            Some("v1.37.2")
        );
        assert_eq!(
            required_version("require k8s.io/kubernetes v1.36.1\n", "k8s.io/kubernetes").as_deref(),
            Some("v1.36.1")
        );
        assert_eq!(required_version(go_mod, "k8s.io/api"), None);
        let flags = version_ldflags("v1.37.2");
        assert!(flags.contains("-X k8s.io/component-base/version.gitVersion=v1.37.2"));
        assert!(flags.contains("-X k8s.io/client-go/pkg/version.gitMinor=37"));
        assert!(kubernetes_version().unwrap().starts_with("v1."));
    }

    #[test]
    fn every_module_has_its_sources_here() {
        let layout = Layout::at(PathBuf::from("/w/target/cluster"));
        for module in modules(&layout).unwrap() {
            let dir = workspace_root().join("xtask/cluster").join(module.dir);
            assert!(dir.join("go.mod").is_file(), "{}", dir.display());
            assert!(dir.join("go.sum").is_file(), "{}", dir.display());
            let mut hasher = Fnv::default();
            hash_sources(&dir, &dir, &mut hasher).unwrap();
        }
    }
}
