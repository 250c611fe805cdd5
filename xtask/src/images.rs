//! `cargo xtask images`: the container images of Tessera, as OCI archives
//! under `target/images/`, written without a Docker daemon or a registry.
//!
//! | archive                 | image (defaults)                             |
//! |-------------------------|----------------------------------------------|
//! | `tessera-agent.tar`     | `localhost/tessera/tessera-agent:<appVersion>` |
//! | `tessera-scheduler.tar` | `localhost/tessera/tessera-scheduler:<appVersion>` |
//! | `kube-scheduler.tar`    | `registry.k8s.io/kube-scheduler:<v of xtask/cluster/kube>` |
//! | `workload.tar`          | `localhost/tessera/workload:dev`             |
//!
//! The names are those the chart's defaults give (`image.registry`,
//! `image.tag` or the chart's appVersion, `scheduler.kubeScheduler`);
//! `--registry` and `--tag` change the first two.
//!
//! - `tessera-agent`: `/usr/bin/tessera-agent` (the entrypoint), the
//!   preload library at the chart's `agent.preload.source`
//!   ([`PRELOAD_SOURCE`]), the eBPF objects in `/usr/lib/tessera/` (where
//!   the agent's config, `_helpers.tpl`, names them), and a static busybox
//!   in `/bin` with a link per applet: the shell, cp, cmp, ln, mkdir,
//!   chmod, sync, rm and printf of the chart's preload init step.
//! - `tessera-scheduler`: `/usr/bin/tessera-scheduler` (the entrypoint),
//!   user 65532 as the chart runs it.
//! - `kube-scheduler`: upstream's `k8s.io/kubernetes/cmd/kube-scheduler` at
//!   the version the cluster's Go module pins, built from that module
//!   (sharing its Go build cache), at `/usr/local/bin/kube-scheduler`: the
//!   chart runs it as the command `kube-scheduler`. No registry is
//!   reachable from the project's machines, so the image the chart's
//!   scheduler pod names is made here.
//! - `workload`: the simulator's C workload program
//!   (`xtask/gpusim/tests/c/workload.c`, an unmodified CUDA driver API
//!   program linked with `-lcuda`) as the entrypoint at
//!   `/usr/local/bin/workload`; its arguments are its operations. The
//!   driver libraries (`libcuda.so.1`, `libnvidia-ml.so.1`) are not in it:
//!   the node injects them into GPU containers, as NVIDIA's container
//!   toolkit injects the real driver's.
//!
//! Each program brings the shared libraries it links (found with `ldd`:
//! the loader, libc, libgcc_s), at the paths this machine has them,
//! symbolic links included (`/lib -> usr/lib` on a merged-/usr Debian).
//! The workload image also brings what the injected libraries and the
//! preload library link, so they load in it. The archives are written by
//! the cluster's Go program `oci-image` (one gzip-compressed layer,
//! reproducible) and are read by `ctr images import`, `skopeo` and
//! `crane`.
//!
//! The Rust artifacts are the release build (`cargo xtask build
//! --release`, cached by cargo) unless `--artifacts` names a built folder;
//! the Go programs are built by `go build` (cached by Go). `--import`
//! imports the archives into the containerd of `cargo xtask cluster`.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs;
use std::path::{Component, Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::artifacts::Artifacts;
use crate::build;
use crate::cluster::Layout;
use crate::sh::{self, workspace_root};

/// The chart's default `image.registry`: images built here, named as
/// podman and buildah name local builds. Set the chart's `image.registry`
/// (and `--registry` here) to the registry they are pushed to.
pub const DEFAULT_REGISTRY: &str = "localhost/tessera";
/// The workload image's tag (a test image, not a release).
pub const WORKLOAD_TAG: &str = "dev";
/// The chart's default `agent.preload.source`.
pub const PRELOAD_SOURCE: &str = "/usr/lib/tessera/libtessera.so";
/// Where the agent's configuration (the chart's `_helpers.tpl`) and its
/// built-in defaults look for the eBPF objects.
const EBPF_DIR: &str = "/usr/lib/tessera";
/// The eBPF objects of the artifacts' `ebpf/` folder.
const EBPF_OBJECTS: [&str; 2] = ["tessera.bpf.o", "tessera-guard.bpf.o"];
/// The user the chart runs the scheduler's containers as.
const NONROOT_USER: &str = "65532";
/// Libraries the node injects into GPU containers: never in an image.
const INJECTED: [&str; 2] = ["libcuda.so.1", "libnvidia-ml.so.1"];
/// The project's source, as a label of every image.
const SOURCE: &str = "https://github.com/tessera-gpu/tessera";

#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    /// Registry and path prefix of the tessera images and the workload
    /// image: the chart's `image.registry`.
    #[arg(long, default_value = DEFAULT_REGISTRY)]
    pub registry: String,
    /// Tag of the tessera images: the chart's `image.tag` (default: the
    /// chart's appVersion). It is also the preload library's version
    /// directory on the nodes: a changed library needs a new tag.
    #[arg(long)]
    pub tag: Option<String>,
    /// Folder of the archives (default: target/images).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Use the artifacts already built in DIR (`target/tessera/<profile>`,
    /// with `ebpf/`) instead of the release build.
    #[arg(long, value_name = "DIR")]
    pub artifacts: Option<PathBuf>,
    /// Then import the images into the containerd of `cargo xtask
    /// cluster` (which must be up).
    #[arg(long)]
    pub import: bool,
}

impl Default for Args {
    fn default() -> Self {
        Self {
            registry: DEFAULT_REGISTRY.to_owned(),
            tag: None,
            out: None,
            artifacts: None,
            import: false,
        }
    }
}

/// One written image.
#[derive(Clone, Debug)]
pub struct Image {
    /// Full name, e.g. `localhost/tessera/tessera-agent:0.1.0`.
    pub name: String,
    /// Its OCI archive.
    pub archive: PathBuf,
}

pub fn run(args: &Args) -> Result<()> {
    let images = build(args)?;
    if args.import {
        import_with(&images, cluster_ctr()?)?;
    }
    Ok(())
}

/// Builds what the images need (cached) and writes their archives.
pub fn build(args: &Args) -> Result<Vec<Image>> {
    let registry = args.registry.trim_end_matches('/');
    check_registry(registry)?;
    let tag = match &args.tag {
        Some(tag) => tag.clone(),
        None => chart_app_version()?,
    };
    check_tag(&tag)?;
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| workspace_root().join("target/images"));
    let work = out.join("work");
    fs::create_dir_all(&work).with_context(|| format!("cannot create {}", work.display()))?;

    let artifacts = match &args.artifacts {
        Some(dir) => Artifacts {
            dir: dir
                .canonicalize()
                .with_context(|| format!("no artifacts at {}", dir.display()))?,
        },
        None => build::run(
            &build::Args {
                release: true,
                no_ebpf: false,
            },
            None,
        )?,
    };
    let go = go_program().context(
        "no go toolchain (`go` on PATH or /usr/local/go/bin/go): the image writer and \
         kube-scheduler are Go programs",
    )?;
    let oci_image = build_oci_image(&go, &work)?;
    let kube_version = kubernetes_version()?;
    let kube_scheduler = build_kube_scheduler(&go, &work, &kube_version)?;
    let workload = work.join("workload");
    compile_workload(&artifacts.sim(), &workload)?;
    let busybox = sh::on_path("busybox").context(
        "no busybox on PATH for the agent image's shell: install Debian's busybox-static \
         (`cargo xtask setup` does, as root)",
    )?;

    let labels = |title: &str, version: &str| {
        vec![
            format!("org.opencontainers.image.title={title}"),
            format!("org.opencontainers.image.version={version}"),
            format!("org.opencontainers.image.source={SOURCE}"),
        ]
    };

    // tessera-agent
    let mut agent = Tree::default();
    agent.program(
        &without_debug_info(&artifacts.bin().join("tessera-agent"), &work)?,
        "/usr/bin/tessera-agent",
        &[],
    )?;
    agent.file(&artifacts.lib().join("libtessera.so"), PRELOAD_SOURCE)?;
    for object in EBPF_OBJECTS {
        agent.file(
            &artifacts.ebpf().join(object),
            &format!("{EBPF_DIR}/{object}"),
        )?;
    }
    agent.program(&busybox, "/bin/busybox", &[])?;
    for applet in busybox_applets(&busybox)? {
        if applet != "busybox" {
            agent.link(&format!("/bin/{applet}"), "busybox");
        }
    }
    let agent = Spec {
        name: format!("{registry}/tessera-agent:{tag}"),
        archive: out.join("tessera-agent.tar"),
        entrypoint: "/usr/bin/tessera-agent",
        user: None,
        labels: labels("tessera-agent", &tag),
        tree: agent,
    };

    // tessera-scheduler
    let mut scheduler = Tree::default();
    scheduler.program(
        &without_debug_info(&artifacts.bin().join("tessera-scheduler"), &work)?,
        "/usr/bin/tessera-scheduler",
        &[],
    )?;
    let scheduler = Spec {
        name: format!("{registry}/tessera-scheduler:{tag}"),
        archive: out.join("tessera-scheduler.tar"),
        entrypoint: "/usr/bin/tessera-scheduler",
        user: Some(NONROOT_USER),
        labels: labels("tessera-scheduler", &tag),
        tree: scheduler,
    };

    // kube-scheduler, under the name the chart's defaults give.
    let mut upstream = Tree::default();
    upstream.program(&kube_scheduler, "/usr/local/bin/kube-scheduler", &[])?;
    let upstream = Spec {
        name: format!("registry.k8s.io/kube-scheduler:{kube_version}"),
        archive: out.join("kube-scheduler.tar"),
        entrypoint: "/usr/local/bin/kube-scheduler",
        user: None,
        labels: vec![
            "org.opencontainers.image.title=kube-scheduler".to_owned(),
            format!("org.opencontainers.image.version={kube_version}"),
            "org.opencontainers.image.source=https://github.com/kubernetes/kubernetes".to_owned(),
        ],
        tree: upstream,
    };

    // workload: the program, and what the libraries injected beside it
    // (and the preload) link.
    let mut tree = Tree::default();
    tree.program(&workload, "/usr/local/bin/workload", &[&artifacts.sim()])?;
    for library in [
        artifacts.sim().join("libcuda.so.1"),
        artifacts.sim().join("libnvidia-ml.so.1"),
        artifacts.lib().join("libtessera.so"),
    ] {
        tree.libraries_of(&library, &[&artifacts.sim()])?;
    }
    tree.dir("/tmp", 0o1777);
    let workload = Spec {
        name: format!("{registry}/workload:{WORKLOAD_TAG}"),
        archive: out.join("workload.tar"),
        entrypoint: "/usr/local/bin/workload",
        user: None,
        labels: labels("workload", WORKLOAD_TAG),
        tree,
    };

    let mut images = Vec::new();
    for spec in [agent, scheduler, upstream, workload] {
        images.push(spec.write(&oci_image)?);
    }
    Ok(images)
}

/// Imports the archives into containerd with `ctr` (its address and the
/// `k8s.io` namespace, where the CRI plugin finds images, already given).
pub fn import_with(images: &[Image], mut ctr: impl FnMut() -> Command) -> Result<()> {
    for image in images {
        sh::output(ctr().args(["images", "import"]).arg(&image.archive))
            .with_context(|| format!("cannot import image {} into containerd", image.name))?;
        eprintln!("imported: {}", image.name);
    }
    Ok(())
}

/// `ctr` of `cargo xtask cluster`, at its containerd, in `k8s.io`.
fn cluster_ctr() -> Result<impl FnMut() -> Command> {
    let layout = Layout::new();
    let ctr = layout.bin().join("ctr");
    // As `cluster::Layout` places it (target/cluster/run/containerd/).
    let socket = workspace_root().join("target/cluster/run/containerd/containerd.sock");
    if !socket.exists() || !ctr.is_file() {
        bail!(
            "the cluster is not up ({} is missing): run `cargo xtask cluster up` first",
            socket.display()
        );
    }
    Ok(move || {
        let mut cmd = Command::new(&ctr);
        cmd.arg("--address")
            .arg(&socket)
            .args(["--namespace", "k8s.io"]);
        cmd
    })
}

/// An image to write.
struct Spec {
    name: String,
    archive: PathBuf,
    entrypoint: &'static str,
    user: Option<&'static str>,
    labels: Vec<String>,
    tree: Tree,
}

impl Spec {
    fn write(self, oci_image: &Path) -> Result<Image> {
        let mut cmd = Command::new(oci_image);
        cmd.args(["--name", &self.name, "--entrypoint", self.entrypoint])
            .arg("--gzip")
            .arg("--out")
            .arg(&self.archive);
        if let Some(user) = self.user {
            cmd.args(["--user", user]);
        }
        for label in &self.labels {
            cmd.args(["--label", label]);
        }
        for (dest, entry) in &self.tree.entries {
            let mut arg = OsString::new();
            match entry {
                Entry::File(src) => {
                    arg.push(src);
                    arg.push("=");
                    arg.push(dest);
                    cmd.arg("--add").arg(arg);
                }
                Entry::Link(target) => {
                    arg.push(dest);
                    arg.push("=");
                    arg.push(target);
                    cmd.arg("--link").arg(arg);
                }
                Entry::Dir(mode) => {
                    arg.push(dest);
                    arg.push(format!("={mode:o}"));
                    cmd.arg("--dir").arg(arg);
                }
            }
        }
        let printed =
            sh::output(&mut cmd).with_context(|| format!("cannot write image {}", self.name))?;
        let size = fs::metadata(&self.archive)
            .with_context(|| format!("cannot stat {}", self.archive.display()))?
            .len();
        eprintln!(
            "image: {} -> {} ({:.1} MiB)",
            printed.trim(),
            self.archive.display(),
            size as f64 / 1048576.0
        );
        Ok(Image {
            name: self.name,
            archive: self.archive,
        })
    }
}

/// One entry of an image's layer.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Entry {
    /// A regular file, from this path of this machine.
    File(PathBuf),
    /// A symbolic link to this target.
    Link(PathBuf),
    /// An empty folder of this mode.
    Dir(u32),
}

/// The entries of one layer, by path in the image.
#[derive(Default)]
struct Tree {
    entries: BTreeMap<PathBuf, Entry>,
}

impl Tree {
    /// A file of this machine at `dest`.
    fn file(&mut self, src: &Path, dest: &str) -> Result<()> {
        if !src.is_file() {
            bail!("{} is missing (for {dest} in an image)", src.display());
        }
        self.put(PathBuf::from(dest), Entry::File(src.to_path_buf()))
    }

    fn link(&mut self, dest: &str, target: &str) {
        self.entries
            .insert(PathBuf::from(dest), Entry::Link(PathBuf::from(target)));
    }

    fn dir(&mut self, dest: &str, mode: u32) {
        self.entries.insert(PathBuf::from(dest), Entry::Dir(mode));
    }

    /// A program at `dest` and the shared libraries it links.
    fn program(&mut self, src: &Path, dest: &str, search: &[&Path]) -> Result<()> {
        self.file(src, dest)?;
        self.libraries_of(src, search)
    }

    /// The shared libraries `object` links (found in `search` first, then
    /// where the loader finds them), each at its path on this machine;
    /// those in `search` and the injected driver libraries left out.
    fn libraries_of(&mut self, object: &Path, search: &[&Path]) -> Result<()> {
        for library in linked_libraries(object, search)? {
            if search.iter().any(|dir| library.starts_with(dir)) {
                continue;
            }
            self.host_path(&library)?;
        }
        Ok(())
    }

    /// `path` of this machine at the same path in the image, with every
    /// symbolic link on the way to the file (each at its own path), so
    /// that the image resolves `path` as this machine does.
    fn host_path(&mut self, path: &Path) -> Result<()> {
        let mut pending: Vec<OsString> = components(path);
        let mut current = PathBuf::from("/");
        let mut links = 0;
        while let Some(part) = pending.pop() {
            if part == "." {
                continue;
            }
            if part == ".." {
                current.pop();
                continue;
            }
            let next = current.join(&part);
            let meta = fs::symlink_metadata(&next).with_context(|| {
                format!("cannot stat {} (for {})", next.display(), path.display())
            })?;
            if meta.file_type().is_symlink() {
                links += 1;
                if links > 40 {
                    bail!("too many symbolic links resolving {}", path.display());
                }
                let target = fs::read_link(&next)
                    .with_context(|| format!("cannot read link {}", next.display()))?;
                self.put(next.clone(), Entry::Link(target.clone()))?;
                if target.is_absolute() {
                    current = PathBuf::from("/");
                }
                pending.extend(components(&target));
            } else {
                current = next;
            }
        }
        if !fs::metadata(&current).is_ok_and(|m| m.is_file()) {
            bail!(
                "{} (for {}) is not a regular file",
                current.display(),
                path.display()
            );
        }
        self.put(current.clone(), Entry::File(current))
    }

    /// Adds an entry; the same entry twice is one, two different ones at
    /// one path an error.
    fn put(&mut self, dest: PathBuf, entry: Entry) -> Result<()> {
        match self.entries.get(&dest) {
            Some(existing) if *existing != entry => bail!(
                "{} would be both {existing:?} and {entry:?} in an image",
                dest.display()
            ),
            Some(_) => Ok(()),
            None => {
                self.entries.insert(dest, entry);
                Ok(())
            }
        }
    }
}

/// The normal, `.` and `..` parts of `path`, last first (a stack).
fn components(path: &Path) -> Vec<OsString> {
    let mut parts: Vec<OsString> = path
        .components()
        .filter_map(|c| match c {
            Component::Normal(p) => Some(p.to_owned()),
            Component::CurDir => Some(".".into()),
            Component::ParentDir => Some("..".into()),
            Component::RootDir | Component::Prefix(_) => None,
        })
        .collect();
    parts.reverse();
    parts
}

/// The shared libraries `object` needs, as `ldd` resolves them (with
/// `search` as `LD_LIBRARY_PATH`): none for a static program. An injected
/// driver library that is not found is left out; any other is an error.
fn linked_libraries(object: &Path, search: &[&Path]) -> Result<Vec<PathBuf>> {
    let mut cmd = Command::new("ldd");
    cmd.arg(object);
    if !search.is_empty() {
        cmd.env(
            "LD_LIBRARY_PATH",
            std::env::join_paths(search).context("a search folder holds ':'")?,
        );
    }
    let out = cmd
        .output()
        .context("cannot run ldd (Debian's libc-bin has it)")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let errors = String::from_utf8_lossy(&out.stderr);
    if text.contains("not a dynamic executable")
        || errors.contains("not a dynamic executable")
        || text.contains("statically linked")
    {
        return Ok(Vec::new());
    }
    if !out.status.success() {
        bail!("ldd {} failed: {}", object.display(), errors.trim());
    }
    parse_ldd(&text).with_context(|| format!("ldd {}", object.display()))
}

fn parse_ldd(text: &str) -> Result<Vec<PathBuf>> {
    let mut libraries = Vec::new();
    for line in text.lines().map(str::trim) {
        let path = match line.split_once("=>") {
            Some((name, rest)) => {
                let name = name.trim();
                let rest = rest.trim();
                if rest.starts_with("not found") {
                    if INJECTED.contains(&name) {
                        continue;
                    }
                    bail!("library {name} is not found");
                }
                rest.split(" (").next().unwrap_or("").trim()
            }
            None => line.split(" (").next().unwrap_or("").trim(),
        };
        // linux-vdso.so.1 and its kin are the kernel's, in no file.
        if path.starts_with('/') {
            libraries.push(PathBuf::from(path));
        }
    }
    Ok(libraries)
}

/// The applets `busybox` has.
fn busybox_applets(busybox: &Path) -> Result<Vec<String>> {
    let list = sh::output(Command::new(busybox).arg("--list"))?;
    let applets: Vec<String> = list
        .lines()
        .map(str::trim)
        .filter(|a| !a.is_empty() && !a.contains('/'))
        .map(str::to_owned)
        .collect();
    for needed in ["sh", "cp", "cmp", "ln", "mkdir", "chmod", "sync", "rm"] {
        if !applets.iter().any(|a| a == needed) {
            bail!(
                "{} has no {needed} applet (the chart's preload init step runs it)",
                busybox.display()
            );
        }
    }
    Ok(applets)
}

/// A copy of `program` in `work` without its debug information (the
/// release profile keeps line tables: 150 MB of the agent's 155), its
/// symbols kept for backtraces.
fn without_debug_info(program: &Path, work: &Path) -> Result<PathBuf> {
    let name = program
        .file_name()
        .with_context(|| format!("{} names no file", program.display()))?;
    let out = work.join(name);
    sh::output(
        Command::new("objcopy")
            .arg("--strip-debug")
            .arg(program)
            .arg(&out),
    )
    .context("cannot strip the debug information (objcopy: Debian's binutils, with gcc)")?;
    Ok(out)
}

/// The Go toolchain: `go` on PATH, else the usual install location.
fn go_program() -> Option<PathBuf> {
    sh::on_path("go").or_else(|| {
        let usual = PathBuf::from("/usr/local/go/bin/go");
        usual.is_file().then_some(usual)
    })
}

/// `go build` in the cluster's Go module `module`, never fetching another
/// toolchain.
fn go_build(go: &Path, module: &str, cgo: bool) -> Command {
    let mut cmd = Command::new(go);
    cmd.current_dir(workspace_root().join("xtask/cluster").join(module))
        .args(["build", "-trimpath"])
        .env("GOTOOLCHAIN", "local")
        .env("CGO_ENABLED", if cgo { "1" } else { "0" });
    cmd
}

/// The image writer, `xtask/cluster/node/cmd/oci-image` (Go's cache makes
/// a rebuild of an unchanged one quick).
fn build_oci_image(go: &Path, work: &Path) -> Result<PathBuf> {
    let out = work.join("oci-image");
    sh::run(
        go_build(go, "node", false)
            .arg("-o")
            .arg(&out)
            .arg("./cmd/oci-image"),
    )
    .context("cannot build the image writer oci-image")?;
    Ok(out)
}

/// Upstream's kube-scheduler from the cluster's `kube` module: the same
/// packages and build settings as its `tessera-kube` (so Go's cache holds
/// them once that is built), stripped as upstream's release is, and the
/// version stamped as upstream's build stamps it.
fn build_kube_scheduler(go: &Path, work: &Path, version: &str) -> Result<PathBuf> {
    let out = work.join("kube-scheduler");
    let (major, minor) = version
        .trim_start_matches('v')
        .split_once('.')
        .map(|(major, rest)| (major, rest.split('.').next().unwrap_or("0")))
        .unwrap_or(("0", "0"));
    let mut ldflags = vec!["-s".to_owned(), "-w".to_owned()];
    for pkg in [
        "k8s.io/component-base/version",
        "k8s.io/client-go/pkg/version",
    ] {
        ldflags.push(format!(
            "-X {pkg}.gitVersion={version} -X {pkg}.gitMajor={major} -X {pkg}.gitMinor={minor} -X {pkg}.gitTreeState=clean"
        ));
    }
    let ldflags = ldflags.join(" ");
    // Linking takes a while even with every package cached: skipped when
    // the module, the Go version and the flags are those of the last build.
    let module = workspace_root().join("xtask/cluster/kube");
    let mut stamp_text = sh::output(Command::new(go).arg("version"))?;
    stamp_text.push_str(&ldflags);
    for name in ["go.mod", "go.sum"] {
        let path = module.join(name);
        let text = fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
        stamp_text.push_str(&format!("\n{name} {:016x}", fnv1a(&text)));
    }
    let stamp = work.join(".kube-scheduler.stamp");
    if out.is_file() && fs::read_to_string(&stamp).is_ok_and(|s| s == stamp_text) {
        eprintln!("ok: kube-scheduler {version} already built");
        return Ok(out);
    }
    sh::run(
        go_build(go, "kube", true)
            .args(["-ldflags", &ldflags])
            .arg("-o")
            .arg(&out)
            .arg("k8s.io/kubernetes/cmd/kube-scheduler"),
    )
    .context("cannot build kube-scheduler")?;
    fs::write(&stamp, stamp_text).with_context(|| format!("cannot write {}", stamp.display()))?;
    Ok(out)
}

/// 64-bit FNV-1a, a hash that stays the same across Rust versions.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, b| {
        (hash ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The version of `k8s.io/kubernetes` that `xtask/cluster/kube/go.mod`
/// requires, e.g. `v1.37.2`.
fn kubernetes_version() -> Result<String> {
    let path = workspace_root().join("xtask/cluster/kube/go.mod");
    let text =
        fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
    text.lines()
        .find_map(|line| {
            let mut words = line.trim().trim_start_matches("require").split_whitespace();
            (words.next()? == "k8s.io/kubernetes").then(|| words.next().map(str::to_owned))?
        })
        .with_context(|| format!("{} requires no k8s.io/kubernetes", path.display()))
}

/// The chart's appVersion: the default tag of its images.
fn chart_app_version() -> Result<String> {
    let path = workspace_root().join("deploy/helm/tessera/Chart.yaml");
    let text =
        fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
    text.lines()
        .find_map(|line| line.strip_prefix("appVersion:"))
        .map(|v| v.trim().trim_matches(|c| c == '"' || c == '\'').to_owned())
        .filter(|v| !v.is_empty())
        .with_context(|| format!("{} has no appVersion", path.display()))
}

/// The workload, linked with `-lcuda` against the simulator's library
/// and without a run path: the loader finds the injected `libcuda.so.1`
/// where the node puts it, as with NVIDIA's driver.
fn compile_workload(sim: &Path, out: &Path) -> Result<()> {
    let src = workspace_root().join("xtask/gpusim/tests/c/workload.c");
    sh::run(
        Command::new("cc")
            .args(["-O2", "-Wall", "-Werror", "-Wno-unused-function", "-o"])
            .arg(out)
            .arg(&src)
            .arg(format!("-L{}", sim.display()))
            .arg("-lcuda"),
    )
    .context("cannot compile the workload (a C compiler is needed: `cargo xtask setup`)")
}

/// An image tag, also a folder name on the nodes (the chart's check).
fn check_tag(tag: &str) -> Result<()> {
    let mut chars = tag.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
    if !first_ok
        || tag.len() > 128
        || !chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
    {
        bail!("tag {tag:?} is not an image tag ([A-Za-z0-9_][A-Za-z0-9_.-]*, at most 128)");
    }
    Ok(())
}

/// A registry and path prefix, e.g. `registry.example.com:5000/tessera`.
fn check_registry(registry: &str) -> Result<()> {
    let ok = !registry.is_empty()
        && registry.split('/').all(|part| {
            !part.is_empty()
                && part.chars().all(|c| {
                    c.is_ascii_lowercase()
                        || c.is_ascii_digit()
                        || matches!(c, '.' | '_' | '-' | ':')
                })
        });
    if !ok {
        bail!(
            "registry {registry:?} is not a registry and path prefix (lower-case, e.g. registry.example.com/tessera)"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldd_output_gives_the_files() {
        let text = "\tlinux-vdso.so.1 (0x00007ffd)\n\
                    \tlibcuda.so.1 => not found\n\
                    \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f4c)\n\
                    \t/lib64/ld-linux-x86-64.so.2 (0x00007f4d)\n";
        assert_eq!(
            parse_ldd(text).unwrap(),
            [
                PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6"),
                PathBuf::from("/lib64/ld-linux-x86-64.so.2")
            ]
        );
        assert!(parse_ldd("\tlibfoo.so.1 => not found\n").is_err());
    }

    #[test]
    fn tags_and_registries_are_checked() {
        check_tag("0.1.0").unwrap();
        check_tag("v0.2.0-rc.1").unwrap();
        assert!(check_tag("../x").is_err());
        assert!(check_tag("").is_err());
        assert!(check_tag(".x").is_err());
        check_registry(DEFAULT_REGISTRY).unwrap();
        check_registry("registry.example.com:5000/team/tessera").unwrap();
        assert!(check_registry("Registry.example.com").is_err());
        assert!(check_registry("a//b").is_err());
    }

    #[test]
    fn a_host_path_keeps_its_links() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        fs::create_dir_all(root.join("usr/lib/arch")).unwrap();
        fs::write(root.join("usr/lib/arch/libx.so.1.2"), b"x").unwrap();
        std::os::unix::fs::symlink("usr/lib", root.join("lib")).unwrap();
        std::os::unix::fs::symlink("libx.so.1.2", root.join("usr/lib/arch/libx.so.1")).unwrap();
        let mut tree = Tree::default();
        tree.host_path(&root.join("lib/arch/libx.so.1")).unwrap();
        assert_eq!(
            tree.entries.get(&root.join("lib")),
            Some(&Entry::Link("usr/lib".into()))
        );
        assert_eq!(
            tree.entries.get(&root.join("usr/lib/arch/libx.so.1")),
            Some(&Entry::Link("libx.so.1.2".into()))
        );
        let file = root.join("usr/lib/arch/libx.so.1.2");
        assert_eq!(tree.entries.get(&file), Some(&Entry::File(file.clone())));
        assert_eq!(tree.entries.len(), 3);
        // The same path again changes nothing; a clash is an error.
        tree.host_path(&root.join("lib/arch/libx.so.1")).unwrap();
        assert_eq!(tree.entries.len(), 3);
        assert!(tree.put(file, Entry::Dir(0o755)).is_err());
    }

    #[test]
    fn the_defaults_come_from_the_chart_and_the_cluster() {
        assert!(
            chart_app_version()
                .unwrap()
                .chars()
                .next()
                .unwrap()
                .is_ascii_digit()
        );
        assert!(kubernetes_version().unwrap().starts_with("v1."));
        let values =
            fs::read_to_string(workspace_root().join("deploy/helm/tessera/values.yaml")).unwrap();
        assert!(values.contains(&format!("registry: {DEFAULT_REGISTRY}\n")));
        assert!(values.contains(&format!("source: {PRELOAD_SOURCE}\n")));
        // The kube-scheduler image written here is the one the chart names.
        assert!(values.contains(&format!(
            "image: registry.k8s.io/kube-scheduler\n    tag: {}\n",
            kubernetes_version().unwrap()
        )));
    }
}
