//! What the cluster reads and changes of the machine: the cgroup layout,
//! free ports, kernel tunables, the pod network's bridge, the pods'
//! cgroups and processes, mounts; and undoing each on `down`.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use rustix::mount::{UnmountFlags, unmount};
use rustix::process::{Pid, Signal, kill_process};

use crate::sh;

/// The kernel tunables the kubelet sets on start
/// (`setupKernelTunables` in its `pkg/kubelet/cm/container_manager_linux.go`,
/// v1.37: `vm.overcommit_memory`, `vm.panic_on_oom`, `kernel.panic`,
/// `kernel.panic_on_oops`, `kernel.keys.root_maxkeys`,
/// `kernel.keys.root_maxbytes`) and the one the CNI bridge plugin sets for
/// a gateway bridge (`net.ipv4.ip_forward`). `up` records them, `down`
/// puts back any that changed.
pub const TUNABLES: [&str; 7] = [
    "vm.overcommit_memory",
    "vm.panic_on_oom",
    "kernel.panic",
    "kernel.panic_on_oops",
    "kernel.keys.root_maxkeys",
    "kernel.keys.root_maxbytes",
    "net.ipv4.ip_forward",
];

/// System paths the runtime creates whatever its configuration says:
/// the shims' sockets (`/run/containerd/s`, fixed in containerd), libcni's
/// cache (`/var/lib/cni`), the kubelet's container log links
/// (`/var/log/containers`, fixed in the kubelet). `down` removes those
/// that `up` found missing.
pub const SYSTEM_PATHS: [&str; 4] = [
    "/run/containerd",
    "/var/lib/cni",
    "/var/log/containers",
    // The kubelet's device plugin folder, fixed whatever its --root-dir.
    "/var/lib/kubelet",
];

/// The cgroup name under which the kubelet (cgroupfs driver) puts pods.
const PODS_CGROUP: &str = "kubepods";

/// The machine's cgroup layout, which decides the kubelet's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CgroupLayout {
    /// cgroup v2 alone at `/sys/fs/cgroup`.
    Unified,
    /// cgroup v1 controllers at `/sys/fs/cgroup/<controller>`, maybe with
    /// an empty v2 tree beside them (`hybrid`).
    V1 { hybrid: bool },
}

impl CgroupLayout {
    pub fn detect() -> Result<Self> {
        let mounts = tessera_mountinfo::read().context("cannot read the mount table")?;
        Ok(Self::from_mounts(
            mounts
                .iter()
                .map(|m| (m.mount_point.as_path(), m.fs_type.as_str())),
        ))
    }

    fn from_mounts<'a>(mounts: impl Iterator<Item = (&'a Path, &'a str)> + Clone) -> Self {
        let root = Path::new("/sys/fs/cgroup");
        if mounts
            .clone()
            .any(|(point, fs)| point == root && fs == "cgroup2")
        {
            return Self::Unified;
        }
        let hybrid = mounts
            .clone()
            .any(|(point, fs)| fs == "cgroup2" && point.starts_with(root));
        Self::V1 { hybrid }
    }

    pub fn is_v1(&self) -> bool {
        matches!(self, Self::V1 { .. })
    }
}

impl std::fmt::Display for CgroupLayout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unified => write!(f, "v2 (unified); the kubelet uses the cgroupfs driver"),
            Self::V1 { hybrid: true } => write!(
                f,
                "v1 with an empty v2 tree (hybrid); the kubelet uses the cgroupfs driver on v1, with failCgroupV1: false"
            ),
            Self::V1 { hybrid: false } => write!(
                f,
                "v1; the kubelet uses the cgroupfs driver, with failCgroupV1: false"
            ),
        }
    }
}

/// Fails, naming the port, when something listens on one of `ports`.
pub fn check_ports_free(ports: &[(&str, u16)]) -> Result<()> {
    for (host, port) in ports {
        if let Err(e) = std::net::TcpListener::bind((*host, *port)) {
            bail!(
                "port {port} ({host}) is taken ({e}): another cluster or program uses it; `cargo xtask cluster status` tells whether it is this one"
            );
        }
    }
    Ok(())
}

fn sysctl_path(name: &str) -> PathBuf {
    Path::new("/proc/sys").join(name.replace('.', "/"))
}

/// The current values of [`TUNABLES`] (those this kernel has).
pub fn read_tunables() -> BTreeMap<String, String> {
    TUNABLES
        .iter()
        .filter_map(|name| {
            let value = fs::read_to_string(sysctl_path(name)).ok()?;
            Some(((*name).to_owned(), value.trim().to_owned()))
        })
        .collect()
}

/// Writes back every recorded tunable whose value changed.
pub fn restore_tunables(recorded: &BTreeMap<String, String>, problems: &mut Vec<String>) {
    for (name, value) in recorded {
        let path = sysctl_path(name);
        let now = fs::read_to_string(&path).map(|v| v.trim().to_owned());
        if now.as_deref().is_ok_and(|now| now == value) {
            continue;
        }
        match fs::write(&path, value) {
            Ok(()) => eprintln!(
                "restored {name} = {value} (was {})",
                now.unwrap_or_else(|e| format!("unreadable: {e}"))
            ),
            Err(e) => problems.push(format!("cannot restore {name} to {value}: {e}")),
        }
    }
}

pub fn link_exists(name: &str) -> bool {
    Path::new("/sys/class/net").join(name).exists()
}

/// Creates the pod network's bridge with the node's address, up; returns
/// whether it created it (false: it was there already).
pub fn create_bridge(name: &str, address: &str, prefix: u8) -> Result<bool> {
    if link_exists(name) {
        eprintln!("ok: bridge {name} already present");
        return Ok(false);
    }
    let cidr = format!("{address}/{prefix}");
    sh::run(Command::new("ip").args(["link", "add", name, "type", "bridge"]))
        .with_context(|| format!("cannot create bridge {name}"))?;
    let configured = sh::run(Command::new("ip").args(["addr", "add", &cidr, "dev", name]))
        .and_then(|()| sh::run(Command::new("ip").args(["link", "set", name, "up"])));
    if let Err(e) = configured {
        let _ = sh::run(Command::new("ip").args(["link", "del", name]));
        return Err(e.context(format!("cannot give bridge {name} the address {cidr}")));
    }
    Ok(true)
}

/// Adds `address` (a host address, /32) to link `name`; present already
/// is done. It goes with the link.
pub fn add_address(name: &str, address: &str) -> Result<()> {
    let cidr = format!("{address}/32");
    let shown = sh::output(Command::new("ip").args(["-4", "-o", "addr", "show", "dev", name]))
        .with_context(|| format!("cannot read the addresses of {name}"))?;
    if shown.split_whitespace().any(|w| w == cidr) {
        return Ok(());
    }
    sh::run(Command::new("ip").args(["addr", "add", &cidr, "dev", name]))
        .with_context(|| format!("cannot give {name} the address {cidr}"))
}

/// Mount points a node is expected to have shared.
pub const SHARED_MOUNTS: [&str; 1] = ["/sys/fs/bpf"];

/// Makes the mount at `point` shared; `true` when it was not (and so was
/// changed), `false` when it already was or nothing is mounted there.
pub fn make_shared(point: &Path) -> Result<bool> {
    let mounts = tessera_mountinfo::read().context("cannot read the mount table")?;
    let Some(mount) = mounts.iter().rev().find(|m| m.mount_point == point) else {
        return Ok(false);
    };
    if mount.is_shared() {
        return Ok(false);
    }
    sh::run(Command::new("mount").arg("--make-shared").arg(point))
        .with_context(|| format!("cannot make the mount at {} shared", point.display()))?;
    Ok(true)
}

/// Makes the mount at `point` private again.
pub fn make_private(point: &Path, problems: &mut Vec<String>) {
    match sh::run(Command::new("mount").arg("--make-private").arg(point)) {
        Ok(()) => eprintln!("made {} private again", point.display()),
        Err(e) => problems.push(format!(
            "cannot make {} private again: {e:#}",
            point.display()
        )),
    }
}

pub fn delete_link(name: &str, problems: &mut Vec<String>) {
    match sh::run(Command::new("ip").args(["link", "del", name])) {
        Ok(()) => eprintln!("deleted bridge {name}"),
        Err(e) => problems.push(format!("cannot delete bridge {name}: {e:#}")),
    }
}

/// The mount points of the cgroup hierarchies (v1 controllers, v2).
fn cgroup_mounts() -> Vec<PathBuf> {
    tessera_mountinfo::read()
        .unwrap_or_default()
        .into_iter()
        .filter(|m| m.fs_type == "cgroup" || m.fs_type == "cgroup2")
        .map(|m| m.mount_point)
        .collect()
}

/// Every cgroup folder at or below `dir`, deepest first.
fn cgroups_below(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                found.extend(cgroups_below(&entry.path()));
            }
        }
    }
    found.push(dir.to_path_buf());
    found
}

/// The pids in the `kubepods` cgroups of every hierarchy.
fn pod_pids() -> Vec<i32> {
    let mut pids = Vec::new();
    for mount in cgroup_mounts() {
        let pods = mount.join(PODS_CGROUP);
        if !pods.is_dir() {
            continue;
        }
        for cgroup in cgroups_below(&pods) {
            if let Ok(text) = fs::read_to_string(cgroup.join("cgroup.procs")) {
                pids.extend(text.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
            }
        }
    }
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// SIGKILLs every process in the pods' cgroups (the kubelet is stopped by
/// then: nothing restarts them) and waits for them to go.
pub fn kill_pods(problems: &mut Vec<String>) {
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut killed = 0;
    loop {
        let pids = pod_pids();
        if pids.is_empty() {
            if killed > 0 {
                eprintln!("killed {killed} pod process(es)");
            }
            return;
        }
        if Instant::now() >= deadline {
            problems.push(format!("pod processes survive SIGKILL: {pids:?}"));
            return;
        }
        for pid in pids {
            if let Some(pid) = Pid::from_raw(pid)
                && kill_process(pid, Signal::KILL).is_ok()
            {
                killed += 1;
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// SIGKILLs the runc shims that run this cluster's shim binary (`exe`),
/// which containerd started as daemons of their own.
pub fn kill_shims(exe: &Path, problems: &mut Vec<String>) {
    let Ok(exe) = exe.canonicalize() else {
        return;
    };
    let shims = || -> Vec<i32> {
        let Ok(entries) = fs::read_dir("/proc") else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
            .filter(|pid| {
                fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|target| target == exe)
            })
            .collect()
    };
    let found = shims();
    for pid in &found {
        if let Some(pid) = Pid::from_raw(*pid) {
            let _ = kill_process(pid, Signal::KILL);
        }
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while !shims().is_empty() {
        if Instant::now() >= deadline {
            problems.push(format!("runc shims survive SIGKILL: {:?}", shims()));
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    if !found.is_empty() {
        eprintln!("killed {} runc shim(s)", found.len());
    }
}

/// Removes the `kubepods` cgroups (deepest first) of every hierarchy.
pub fn remove_pod_cgroups(problems: &mut Vec<String>) {
    for mount in cgroup_mounts() {
        let pods = mount.join(PODS_CGROUP);
        if !pods.is_dir() {
            continue;
        }
        for cgroup in cgroups_below(&pods) {
            if let Err(e) = fs::remove_dir(&cgroup) {
                problems.push(format!("cannot remove cgroup {}: {e}", cgroup.display()));
            }
        }
    }
}

/// Unmounts every mount at or below `dir`, deepest first (lazily, so a
/// busy one still leaves the tree).
pub fn unmount_under(dir: &Path, problems: &mut Vec<String>) {
    // The mount table shows the canonical path.
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    let mut points: Vec<PathBuf> = tessera_mountinfo::read()
        .unwrap_or_default()
        .into_iter()
        .map(|m| m.mount_point)
        .filter(|p| p.starts_with(&dir))
        .collect();
    // Deepest first; a point mounted twice is unmounted twice.
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    let count = points.len();
    for point in points {
        if let Err(e) = unmount(&point, UnmountFlags::DETACH)
            && e != rustix::io::Errno::INVAL
        {
            problems.push(format!("cannot unmount {}: {e}", point.display()));
        }
    }
    if count > 0 {
        eprintln!("unmounted {count} mount(s) under {}", dir.display());
    }
}

/// Removes a file or folder tree that the cluster made, if there.
pub fn remove_created(path: &Path, problems: &mut Vec<String>) {
    let result = match fs::symlink_metadata(path) {
        Err(_) => return,
        Ok(meta) if meta.is_dir() => fs::remove_dir_all(path),
        Ok(_) => fs::remove_file(path),
    };
    match result {
        Ok(()) => eprintln!("removed {}", path.display()),
        Err(e) => problems.push(format!("cannot remove {}: {e}", path.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(mounts: &[(&str, &str)]) -> CgroupLayout {
        let mounts: Vec<(PathBuf, String)> = mounts
            .iter()
            .map(|(p, f)| (PathBuf::from(p), (*f).to_owned()))
            .collect();
        CgroupLayout::from_mounts(mounts.iter().map(|(p, f)| (p.as_path(), f.as_str())))
    }

    #[test]
    fn tells_the_cgroup_layouts_apart() {
        assert_eq!(
            layout(&[("/", "ext4"), ("/sys/fs/cgroup", "cgroup2")]),
            CgroupLayout::Unified
        );
        assert_eq!(
            layout(&[
                ("/sys/fs/cgroup", "tmpfs"),
                ("/sys/fs/cgroup/memory", "cgroup"),
                ("/sys/fs/cgroup/unified", "cgroup2"),
            ]),
            CgroupLayout::V1 { hybrid: true }
        );
        assert_eq!(
            layout(&[
                ("/sys/fs/cgroup", "tmpfs"),
                ("/sys/fs/cgroup/memory", "cgroup")
            ]),
            CgroupLayout::V1 { hybrid: false }
        );
    }

    #[test]
    fn tunables_map_to_proc_sys() {
        assert_eq!(
            sysctl_path("kernel.keys.root_maxkeys"),
            Path::new("/proc/sys/kernel/keys/root_maxkeys")
        );
        // Every tunable this kernel has is read.
        let read = read_tunables();
        assert!(read.contains_key("vm.overcommit_memory"), "{read:?}");
    }

    #[test]
    fn lists_cgroups_deepest_first() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("a/b")).unwrap();
        let found = cgroups_below(dir.path());
        assert_eq!(found.first().unwrap(), &dir.path().join("a/b"));
        assert_eq!(found.last().unwrap(), dir.path());
    }
}
