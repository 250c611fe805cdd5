//! `cargo xtask images`, each archive judged by readers other than the
//! writer: GNU tar unpacks the archive and its layer, `sha256sum` checks
//! every blob against its digest, the OCI layout (index.json, manifest,
//! config) is read as JSON, and the names are compared with the chart's
//! own files (values.yaml, Chart.yaml). As root, each image's programs run
//! from the unpacked layer under `chroot`: the agent and the chart's
//! preload init step (its script, with the busybox of the image), the
//! extender as the chart's user, kube-scheduler, and the CUDA workload,
//! first without the driver library (the image's loader names the missing
//! one), then with the simulator's injected beside it, doing CUDA calls.
//!
//! Uses the built artifacts (`TESSERA_ARTIFACTS`, as the other tests; with
//! the eBPF objects, as `cargo xtask test` builds them) and needs Go, a C
//! compiler and busybox (`cargo xtask setup`).
#![allow(clippy::unwrap_used)] // helpers of a test crate

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn skip(reason: &str) {
    eprintln!("skipped: {reason}");
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

fn have(program: &str) -> bool {
    tessera_testkit::programs::on_path(program).is_some()
        || (program == "go" && Path::new("/usr/local/go/bin/go").is_file())
}

fn show(what: &str, out: &Output) -> String {
    format!(
        "{what}: {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn run_ok(cmd: &mut Command) -> Output {
    let what = format!("{cmd:?}");
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{}", show(&what, &out));
    out
}

/// `key: value` of a YAML file's line that starts (after indent) with
/// `key:`, below the line `section:` when given: enough for the chart's
/// flat defaults, and independent of the code under test.
fn yaml_value(path: &Path, section: Option<&str>, key: &str) -> String {
    let text = fs::read_to_string(path).unwrap();
    let mut inside = section.is_none();
    for line in text.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with('#') {
            continue;
        }
        if let Some(s) = section
            && trimmed == format!("{s}:")
        {
            inside = true;
            continue;
        }
        if inside && let Some(value) = trimmed.strip_prefix(&format!("{key}:")) {
            return value.trim().trim_matches('"').to_owned();
        }
    }
    panic!("{} has no {key} (in {section:?})", path.display());
}

/// One image archive, unpacked and read.
struct Unpacked {
    name: String,
    config: Value,
    /// The unpacked layer.
    root: PathBuf,
    /// `tar -tv` of the layer: path -> (mode string, owner, link target).
    listing: BTreeMap<String, (String, String, Option<String>)>,
}

fn sha256(path: &Path) -> String {
    let out = run_ok(Command::new("sha256sum").arg(path));
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_owned()
}

fn blob(dir: &Path, digest: &str) -> PathBuf {
    let hex = digest.strip_prefix("sha256:").unwrap();
    let path = dir.join("blobs/sha256").join(hex);
    assert_eq!(
        sha256(&path),
        hex,
        "{} does not match its digest",
        path.display()
    );
    path
}

fn unpack(archive: &Path, into: &Path) -> Unpacked {
    let layout = into.join("layout");
    let root = into.join("root");
    fs::create_dir_all(&layout).unwrap();
    fs::create_dir_all(&root).unwrap();
    run_ok(
        Command::new("tar")
            .arg("-xf")
            .arg(archive)
            .arg("-C")
            .arg(&layout),
    );
    let oci_layout: Value =
        serde_json::from_str(&fs::read_to_string(layout.join("oci-layout")).unwrap()).unwrap();
    assert_eq!(oci_layout["imageLayoutVersion"], "1.0.0");
    let index: Value =
        serde_json::from_str(&fs::read_to_string(layout.join("index.json")).unwrap()).unwrap();
    let manifests = index["manifests"].as_array().unwrap();
    assert_eq!(manifests.len(), 1, "{index}");
    let entry = &manifests[0];
    assert_eq!(
        entry["mediaType"],
        "application/vnd.oci.image.manifest.v1+json"
    );
    let name = entry["annotations"]["io.containerd.image.name"]
        .as_str()
        .unwrap()
        .to_owned();
    let tag = name.rsplit_once(':').unwrap().1;
    assert_eq!(
        entry["annotations"]["org.opencontainers.image.ref.name"],
        tag
    );
    let manifest_path = blob(&layout, entry["digest"].as_str().unwrap());
    assert_eq!(
        fs::metadata(&manifest_path).unwrap().len(),
        entry["size"].as_u64().unwrap()
    );
    let manifest: Value =
        serde_json::from_str(&fs::read_to_string(&manifest_path).unwrap()).unwrap();
    assert_eq!(manifest["schemaVersion"], 2);
    let config_path = blob(&layout, manifest["config"]["digest"].as_str().unwrap());
    assert_eq!(
        manifest["config"]["mediaType"],
        "application/vnd.oci.image.config.v1+json"
    );
    let config: Value = serde_json::from_str(&fs::read_to_string(&config_path).unwrap()).unwrap();
    assert_eq!(config["os"], "linux");
    assert_eq!(
        config["architecture"],
        std::env::consts::ARCH
            .replace("x86_64", "amd64")
            .replace("aarch64", "arm64")
    );
    let layers = manifest["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 1);
    assert_eq!(
        layers[0]["mediaType"],
        "application/vnd.oci.image.layer.v1.tar+gzip"
    );
    let layer = blob(&layout, layers[0]["digest"].as_str().unwrap());
    assert_eq!(
        fs::metadata(&layer).unwrap().len(),
        layers[0]["size"].as_u64().unwrap()
    );
    // The diff id is the digest of the uncompressed layer.
    let plain = into.join("layer.tar");
    let gunzip = run_ok(Command::new("gzip").arg("-dc").arg(&layer));
    fs::write(&plain, &gunzip.stdout).unwrap();
    assert_eq!(
        config["rootfs"]["diff_ids"][0].as_str().unwrap(),
        format!("sha256:{}", sha256(&plain))
    );
    let list = run_ok(
        Command::new("tar")
            .args(["--numeric-owner", "-tvf"])
            .arg(&plain),
    );
    let mut listing = BTreeMap::new();
    for line in String::from_utf8_lossy(&list.stdout).lines() {
        // MODE OWNER SIZE DATE TIME PATH [-> TARGET]
        let words: Vec<&str> = line.split_whitespace().collect();
        let (path, target) = match words.iter().position(|w| *w == "->") {
            Some(arrow) => (
                words[5..arrow].join(" "),
                Some(words[arrow + 1..].join(" ")),
            ),
            None => (words[5..].join(" "), None),
        };
        let path = format!("/{}", path.trim_end_matches('/'));
        listing.insert(path, (words[0].to_owned(), words[1].to_owned(), target));
    }
    run_ok(
        Command::new("tar")
            .args(["--numeric-owner", "-xpf"])
            .arg(&plain)
            .arg("-C")
            .arg(&root),
    );
    Unpacked {
        name,
        config,
        root,
        listing,
    }
}

impl Unpacked {
    /// `path` in the image with every link followed inside the image.
    fn resolve(&self, path: &str) -> PathBuf {
        let mut current = PathBuf::from("/");
        let mut pending: Vec<String> = path
            .split('/')
            .filter(|p| !p.is_empty())
            .rev()
            .map(str::to_owned)
            .collect();
        let mut hops = 0;
        while let Some(part) = pending.pop() {
            match part.as_str() {
                "." => continue,
                ".." => {
                    current.pop();
                    continue;
                }
                _ => {}
            }
            let next = current.join(&part);
            let here = self.root.join(next.strip_prefix("/").unwrap());
            match fs::symlink_metadata(&here) {
                Ok(m) if m.file_type().is_symlink() => {
                    hops += 1;
                    assert!(hops < 40, "link loop at {path} in {}", self.name);
                    let target = fs::read_link(&here).unwrap();
                    if target.is_absolute() {
                        current = PathBuf::from("/");
                    }
                    let target = target.to_string_lossy().into_owned();
                    pending.extend(
                        target
                            .split('/')
                            .filter(|p| !p.is_empty())
                            .rev()
                            .map(str::to_owned),
                    );
                }
                Ok(_) => current = next,
                Err(e) => panic!("{path} is not in {} ({}: {e})", self.name, next.display()),
            }
        }
        self.root.join(current.strip_prefix("/").unwrap())
    }

    /// Asserts that `path` is a root-owned file in the layer (after links)
    /// with the execute bits when `exec`, and returns its bytes.
    fn file(&self, path: &str, exec: bool) -> Vec<u8> {
        let real = self.resolve(path);
        let in_image = format!("/{}", real.strip_prefix(&self.root).unwrap().display());
        let (mode, owner, _) = self
            .listing
            .get(&in_image)
            .unwrap_or_else(|| panic!("{in_image} ({path}) is not in the layer of {}", self.name));
        assert!(mode.starts_with('-'), "{path} in {} is {mode}", self.name);
        assert_eq!(owner, "0/0", "{path} in {}", self.name);
        if exec {
            assert_eq!(&mode[1..10], "rwxr-xr-x", "{path} in {}", self.name);
            let meta = fs::metadata(&real).unwrap();
            assert_eq!(meta.permissions().mode() & 0o755, 0o755, "{path}");
        } else {
            assert_eq!(
                &mode[7..8],
                "r",
                "{path} in {} is not readable by all",
                self.name
            );
        }
        fs::read(&real).unwrap()
    }

    fn entrypoint(&self) -> Vec<String> {
        self.config["config"]["Entrypoint"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_owned())
            .collect()
    }

    fn env(&self) -> Vec<String> {
        self.config["config"]["Env"]
            .as_array()
            .map(|a| a.iter().map(|v| v.as_str().unwrap().to_owned()).collect())
            .unwrap_or_default()
    }

    /// `chroot [--userspec=USER] ROOT ARGS` with only the image's
    /// environment (and `extra`), in new mount and PID namespaces with
    /// their own /proc at the image's, as a container runtime starts it.
    fn chroot(&self, user: Option<&str>, extra: &[(&str, &str)], args: &[&str]) -> Output {
        let proc = self.root.join("proc");
        fs::create_dir_all(&proc).unwrap();
        // By their paths: the child's PATH is the image's.
        let program = |name: &str| tessera_testkit::programs::on_path(name).unwrap();
        let mut cmd = Command::new(program("unshare"));
        cmd.args(["--mount", "--propagation", "private", "--pid", "--fork"])
            .arg(format!("--mount-proc={}", proc.display()))
            .arg(program("chroot"));
        if let Some(user) = user {
            cmd.arg(format!("--userspec={user}"));
        }
        cmd.arg(&self.root).args(args).env_clear();
        for pair in self.env() {
            let (k, v) = pair.split_once('=').unwrap();
            cmd.env(k, v);
        }
        for (k, v) in extra {
            cmd.env(k, v);
        }
        cmd.output().unwrap()
    }
}

/// ELF header fields: (type, machine).
fn elf(bytes: &[u8]) -> (u16, u16) {
    assert_eq!(&bytes[..4], b"\x7fELF");
    (
        u16::from_le_bytes([bytes[16], bytes[17]]),
        u16::from_le_bytes([bytes[18], bytes[19]]),
    )
}

const ET_DYN: u16 = 3;
const EM_BPF: u16 = 247;

#[test]
fn images_hold_what_the_chart_and_the_node_need() {
    let artifacts = tessera_testkit::sim::artifacts();
    for (program, why) in [
        (
            "go",
            "no go toolchain (the image writer and kube-scheduler are Go programs)",
        ),
        (
            "busybox",
            "no busybox for the agent image (`cargo xtask setup` installs busybox-static)",
        ),
        (
            "cc",
            "no C compiler for the workload (`cargo xtask setup` installs gcc)",
        ),
    ] {
        if !have(program) {
            return skip(why);
        }
    }
    if !artifacts.join("ebpf/tessera.bpf.o").is_file() {
        return skip(
            "the artifacts have no eBPF objects (built with --no-ebpf); `cargo xtask test` builds them",
        );
    }

    // A registry that is no registry is refused before anything is built.
    let bad = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(["images", "--registry", "Not/A/Registry"])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("registry"),
        "{}",
        show("bad", &bad)
    );

    let tmp = tempfile::tempdir().unwrap();
    let out_dir = tmp.path().join("images");
    let out = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(["images", "--artifacts"])
        .arg(&artifacts)
        .arg("--out")
        .arg(&out_dir)
        .output()
        .unwrap();
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{}", show("xtask images", &out));

    // The names the chart's defaults give.
    let chart = workspace().join("deploy/helm/tessera");
    let values = chart.join("values.yaml");
    let registry = yaml_value(&values, Some("image"), "registry");
    let app_version = yaml_value(&chart.join("Chart.yaml"), None, "appVersion");
    let kube_image = yaml_value(&values, Some("kubeScheduler"), "image");
    let kube_tag = yaml_value(&values, Some("kubeScheduler"), "tag");
    let preload_source = yaml_value(&values, Some("preload"), "source");
    let agent_name = yaml_value(&values, Some("agent"), "image");
    let extender_name = yaml_value(&values, Some("extender"), "image");

    let unpack_one = |file: &str| {
        let archive = out_dir.join(file);
        let size = fs::metadata(&archive).unwrap().len();
        eprintln!("{file}: {:.1} MiB", size as f64 / 1048576.0);
        unpack(&archive, &tmp.path().join(file.trim_end_matches(".tar")))
    };
    let agent = unpack_one("tessera-agent.tar");
    let scheduler = unpack_one("tessera-scheduler.tar");
    let upstream = unpack_one("kube-scheduler.tar");
    let workload = unpack_one("workload.tar");
    assert_eq!(agent.name, format!("{registry}/{agent_name}:{app_version}"));
    assert_eq!(
        scheduler.name,
        format!("{registry}/{extender_name}:{app_version}")
    );
    assert_eq!(upstream.name, format!("{kube_image}:{kube_tag}"));
    assert_eq!(workload.name, "localhost/tessera/workload:dev");
    assert_eq!(registry, "localhost/tessera");

    // tessera-agent: the entrypoint, the preload at preload.source, the
    // eBPF objects where the agent's config names them, the shell tools of
    // the init step.
    assert_eq!(agent.entrypoint(), ["/usr/bin/tessera-agent"]);
    agent.file("/usr/bin/tessera-agent", true);
    let preload = agent.file(&preload_source, false);
    assert_eq!(elf(&preload).0, ET_DYN);
    let helpers = fs::read_to_string(chart.join("templates/_helpers.tpl")).unwrap();
    for key in ["ebpf_object", "guard_object"] {
        let line = helpers
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{key} =")))
            .unwrap();
        let path = line.split('"').nth(1).unwrap();
        assert!(path.starts_with("/usr/lib/tessera/"), "{line}");
        assert_eq!(elf(&agent.file(path, false)).1, EM_BPF, "{path}");
    }
    for tool in [
        "sh", "cp", "cmp", "ln", "mkdir", "chmod", "sync", "rm", "printf",
    ] {
        agent.file(&format!("/bin/{tool}"), true);
    }
    assert!(
        agent.config["config"]["User"]
            .as_str()
            .unwrap_or("")
            .is_empty()
    );

    // tessera-scheduler as the chart runs it (user 65532).
    assert_eq!(scheduler.entrypoint(), ["/usr/bin/tessera-scheduler"]);
    scheduler.file("/usr/bin/tessera-scheduler", true);
    assert_eq!(scheduler.config["config"]["User"], "65532");

    // kube-scheduler: the chart's command is `kube-scheduler`, found on
    // the image's PATH.
    let path = upstream
        .env()
        .into_iter()
        .find_map(|e| e.strip_prefix("PATH=").map(str::to_owned))
        .unwrap();
    let found = path
        .split(':')
        .find(|dir| {
            upstream
                .root
                .join(dir.trim_start_matches('/'))
                .join("kube-scheduler")
                .exists()
        })
        .unwrap_or_else(|| panic!("no kube-scheduler on the image's PATH {path}"));
    upstream.file(&format!("{found}/kube-scheduler"), true);

    // workload: the program, without the driver libraries the node injects.
    assert_eq!(workload.entrypoint(), ["/usr/local/bin/workload"]);
    workload.file("/usr/local/bin/workload", true);
    for injected in ["libcuda.so.1", "libnvidia-ml.so.1"] {
        assert!(
            !workload
                .listing
                .keys()
                .any(|p| p.ends_with(&format!("/{injected}"))),
            "{injected} is in the workload image"
        );
    }

    if !is_root() {
        return skip("running the images' programs under chroot needs root");
    }

    // What every container has: /dev/null (the init step's script writes
    // to it) and /dev/zero (the simulator's stand-in device node).
    for image in [&agent, &scheduler, &upstream, &workload] {
        fs::create_dir_all(image.root.join("dev")).unwrap();
        for (node, minor) in [("null", "3"), ("zero", "5")] {
            run_ok(
                Command::new("mknod")
                    .args(["-m", "666"])
                    .arg(image.root.join("dev").join(node))
                    .args(["c", "1", minor]),
            );
        }
    }

    // The agent runs; the chart's init step installs the preload with the
    // image's shell and tools, and a second run keeps the installed file.
    let version = agent.chroot(None, &[], &["/usr/bin/tessera-agent", "--version"]);
    assert!(
        version.status.success(),
        "{}",
        show("agent --version", &version)
    );
    assert!(String::from_utf8_lossy(&version.stdout).starts_with("tessera-agent "));
    let script = fs::read_to_string(chart.join("files/install-preload.sh")).unwrap();
    fs::create_dir_all(agent.root.join("preload")).unwrap();
    let env = [
        ("TESSERA_LIBRARY", preload_source.as_str()),
        ("TESSERA_PRELOAD_DIR", "/preload"),
        ("TESSERA_PRELOAD_VERSION", app_version.as_str()),
        (
            "TESSERA_CONTAINER_LIBRARY",
            "/usr/local/tessera/libtessera.so",
        ),
    ];
    for expected in ["installed /preload/", "is already installed"] {
        let run = agent.chroot(None, &env, &["/bin/sh", "-c", &script]);
        assert!(run.status.success(), "{}", show("install-preload", &run));
        assert!(
            String::from_utf8_lossy(&run.stdout).contains(expected),
            "{}",
            show("install-preload", &run)
        );
    }
    let installed = agent.root.join("preload").join(&app_version);
    assert_eq!(fs::read(installed.join("libtessera.so")).unwrap(), preload);
    assert_eq!(
        fs::read_to_string(installed.join("ld.so.preload")).unwrap(),
        "/usr/local/tessera/libtessera.so\n"
    );

    let help = scheduler.chroot(
        Some("65532:65532"),
        &[],
        &["/usr/bin/tessera-scheduler", "serve", "--help"],
    );
    assert!(
        help.status.success(),
        "{}",
        show("tessera-scheduler serve --help", &help)
    );
    assert!(String::from_utf8_lossy(&help.stdout).contains("--listen"));

    let kube = upstream.chroot(Some("65532:65532"), &[], &["kube-scheduler", "--version"]);
    assert!(
        kube.status.success(),
        "{}",
        show("kube-scheduler --version", &kube)
    );
    assert_eq!(
        String::from_utf8_lossy(&kube.stdout).trim(),
        format!("Kubernetes {kube_tag}")
    );

    // The workload without the driver: the image's loader runs it and
    // names the library the node would inject.
    let bare = workload.chroot(None, &[], &["/usr/local/bin/workload"]);
    assert!(!bare.status.success());
    assert!(
        String::from_utf8_lossy(&bare.stderr).contains("libcuda.so.1"),
        "{}",
        show("workload without libcuda", &bare)
    );
    // With the simulator's driver injected (its own folder, as a runtime
    // may put it), unmodified CUDA calls run on a simulated GPU.
    let driver = workload.root.join("run/driver");
    fs::create_dir_all(&driver).unwrap();
    for lib in ["libcuda.so.1", "libnvidia-ml.so.1"] {
        fs::copy(artifacts.join("sim").join(lib), driver.join(lib)).unwrap();
    }
    let cuda = workload.chroot(
        None,
        &[
            ("LD_LIBRARY_PATH", "/run/driver"),
            ("GPUSIM_STATE", "/tmp/gpusim.state"),
        ],
        &[
            "/usr/local/bin/workload",
            "dev",
            "0",
            "alloc",
            "64",
            "meminfo",
            "free-all",
        ],
    );
    assert!(
        cuda.status.success(),
        "{}",
        show("workload with the driver", &cuda)
    );
    let text = String::from_utf8_lossy(&cuda.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[..2], ["dev ok", "alloc CUDA_SUCCESS"], "{text}");
    let meminfo: Vec<u64> = lines[2]
        .strip_prefix("meminfo ")
        .unwrap_or_else(|| panic!("{text}"))
        .split(' ')
        .map(|n| n.parse().unwrap())
        .collect();
    assert!(meminfo[0] + (64 << 20) <= meminfo[1], "{text}");
    assert_eq!(lines[3..], ["freed 1"], "{text}");
    // The preload library of the agent image loads in the workload image
    // (what it links is there) when /etc/ld.so.preload names it, as in a
    // Tessera container; with no control region it refuses the GPU.
    fs::create_dir_all(workload.root.join("etc")).unwrap();
    fs::create_dir_all(workload.root.join("usr/local/tessera")).unwrap();
    fs::write(
        workload.root.join("usr/local/tessera/libtessera.so"),
        &preload,
    )
    .unwrap();
    fs::write(
        workload.root.join("etc/ld.so.preload"),
        "/usr/local/tessera/libtessera.so\n",
    )
    .unwrap();
    let preloaded = workload.chroot(
        None,
        &[
            ("LD_LIBRARY_PATH", "/run/driver"),
            ("GPUSIM_STATE", "/tmp/gpusim.state"),
        ],
        &["/usr/local/bin/workload", "dev", "0"],
    );
    let errors = String::from_utf8_lossy(&preloaded.stderr);
    assert!(
        !errors.contains("cannot be preloaded"),
        "{}",
        show("preloaded", &preloaded)
    );
    assert!(
        String::from_utf8_lossy(&preloaded.stdout).contains("error init CUDA_ERROR_NOT_PERMITTED")
            && errors.contains("/run/tessera/control"),
        "{}",
        show("workload under the preload", &preloaded)
    );
}
