//! The per-pod device guard: a cgroup device program on each GPU pod's
//! cgroup that denies opening the GPU devices not assigned to the pod.
//!
//! **One program instance per pod, policy in a global.** Each pod gets its
//! own load of `tessera-guard.bpf.o` (a small object with no maps) with its
//! [`GuardPolicy`] written into `TESSERA_GUARD`. The alternative, one
//! program with a policy map keyed by the pod's cgroup id, would need the
//! program to find the pod among the task's ancestors (the level depends
//! on the QoS class) and a pinned map that every agent version agrees on.
//! With a global the policy travels with the link: nothing to reconcile
//! after an agent restart, and a policy change is a new instance that
//! replaces the old one.
//!
//! **Where it attaches.** The pod cgroup, never a container's: runc
//! replaces or detaches the programs of the container cgroup on device
//! updates, and a link cannot be detached by `BPF_PROG_DETACH`
//! (`reference/ebpf.md` §4). The pod's link applies to every container
//! below it, and all device programs on the path must allow, so an
//! allow-all program of the runtime cannot override it.
//!
//! **Pinned.** The link is created by the agent (aya 0.14 cannot pin a
//! cgroup device link, see `tessera-ebpf-sys`) and pinned at
//! `/sys/fs/bpf/tessera/<abi>/guard/<pod-uid>`, so enforcement survives
//! the agent. Replacing a pod's guard pins the new link under a temporary
//! name and renames it over the old pin, which releases the old link; for
//! that moment both run, and the stricter wins. (bpffs names cannot
//! contain dots, so the temporary name is `new-<pod-uid>`.) [`Guards::unguard_pod`]
//! removes the pin (and so the link); the kernel detaches links of a
//! removed cgroup by itself, and [`Guards::prune`] removes their pins.

use std::fs::File;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use aya::{Ebpf, EbpfError, EbpfLoader, programs::CgroupDevice};
use tessera_ebpf_common::{
    ABI_VERSION,
    dev::{class, kdev},
    guard::{DevRange, GuardPolicy, MAX_ALLOWED, MAX_RANGES},
    names,
};
use tessera_error_chain::PathIoError;

use super::devices::{CONTROL_MINOR, Device, MODESET_MINOR, NVIDIA_MAJOR};
use super::mounts;
use crate::cgroup::path::{Classified, classify, valid_uid};
use crate::cgroup::v2 as cgroup;

/// Prefix of a replacement's temporary pin (bpffs refuses names with
/// dots, so not `.<uid>.new`).
const TMP_PREFIX: &str = "new-";

/// Whether `name` can name a pin: 1 to 200 ASCII letters, digits, `-`
/// and `_` (bpffs refuses dots).
pub fn valid_pin_name(name: &str) -> bool {
    (1..=200).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// Largest GPU minor of the NVIDIA frontend.
pub const GPU_MINOR_MAX: u32 = 247;

/// Errors of the guard.
#[derive(Debug, thiserror::Error)]
pub enum GuardError {
    /// The path is not a pod's cgroup.
    #[error("{path} is not a pod cgroup: {why}")]
    NotPodCgroup {
        /// The path.
        path: PathBuf,
        /// Why.
        why: String,
    },
    /// Not a pod UID (and so not a pin name).
    #[error("{0:?} is not a pod uid")]
    BadUid(String),
    /// Too many ranges or allowed devices for one policy.
    #[error("device guard policy for pod {pod} has {what} (at most {max})")]
    TooMany {
        /// The pod.
        pod: String,
        /// What overflowed.
        what: String,
        /// The limit.
        max: usize,
    },
    /// The cgroup v2 root could not be found.
    #[error("cannot find the cgroup v2 hierarchy")]
    Cgroup(#[source] cgroup::CgroupError),
    /// The guard object could not be loaded.
    #[error("cannot load device guard object {path} for pod {pod}")]
    Load {
        /// The object file.
        path: PathBuf,
        /// The pod.
        pod: String,
        /// The cause.
        #[source]
        source: Box<EbpfError>,
    },
    /// The object has no guard program.
    #[error("device guard object {path} has no program {program}")]
    MissingProgram {
        /// The object file.
        path: PathBuf,
        /// The program's name.
        program: &'static str,
    },
    /// The guard program could not be loaded or verified.
    #[error("cannot load device guard program for pod {pod}")]
    Program {
        /// The pod.
        pod: String,
        /// The cause.
        #[source]
        source: Box<aya::programs::ProgramError>,
    },
    /// A file or bpf system call on a cgroup or pin failed: `cannot
    /// {action} {path}`, e.g. "cannot attach device guard to …".
    #[error(transparent)]
    Io(#[from] PathIoError),
    /// bpffs could not be mounted.
    #[error(transparent)]
    Mount(#[from] mounts::MountError),
}

/// Which devices the guard governs on this node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GuardDevices {
    /// Always allowed, checked first (control, modeset, UVM).
    pub always: Vec<DevRange>,
    /// Denied unless assigned (GPU minors, MIG capabilities).
    pub guarded: Vec<DevRange>,
}

impl GuardDevices {
    /// The NVIDIA devices: GPU minors 195:0..=247 (and every
    /// `nvidia-caps` minor) are guarded; 195:254..=255 (modeset, control)
    /// and the `nvidia-uvm` major are always allowed. The dynamic majors
    /// are in `/proc/devices` ([`super::devices::char_major`]).
    pub fn nvidia(uvm_major: Option<u32>, caps_major: Option<u32>) -> Self {
        let mut always = vec![DevRange {
            major: NVIDIA_MAJOR,
            first_minor: MODESET_MINOR,
            last_minor: CONTROL_MINOR,
        }];
        always.extend(uvm_major.map(DevRange::major));
        let mut guarded = vec![DevRange {
            major: NVIDIA_MAJOR,
            first_minor: 0,
            last_minor: GPU_MINOR_MAX,
        }];
        guarded.extend(caps_major.map(DevRange::major));
        Self { always, guarded }
    }

    /// From configured devices (stand-ins in tests and the simulator):
    /// `gpu` and `caps` devices are guarded; `control`, `modeset`, `uvm`
    /// and `uvm-tools` always allowed; others not governed.
    pub fn from_devices(devices: &[Device]) -> Self {
        let mut out = Self::default();
        for d in devices {
            let one = DevRange::one(d.major, d.minor);
            match d.class {
                class::GPU | class::CAPS => out.guarded.push(one),
                class::CONTROL | class::MODESET | class::UVM | class::UVM_TOOLS => {
                    out.always.push(one)
                }
                _ => {}
            }
        }
        out
    }

    /// The policy of a pod allowed `allowed` (major, minor) devices.
    pub fn policy(&self, pod: &str, allowed: &[(u32, u32)]) -> Result<GuardPolicy, GuardError> {
        let too_many = |what: String, max| GuardError::TooMany {
            pod: pod.to_owned(),
            what,
            max,
        };
        if self.always.len() > MAX_RANGES {
            return Err(too_many(
                format!("{} always-allowed ranges", self.always.len()),
                MAX_RANGES,
            ));
        }
        if self.guarded.len() > MAX_RANGES {
            return Err(too_many(
                format!("{} guarded ranges", self.guarded.len()),
                MAX_RANGES,
            ));
        }
        if allowed.len() > MAX_ALLOWED {
            return Err(too_many(
                format!("{} allowed devices", allowed.len()),
                MAX_ALLOWED,
            ));
        }
        let mut p = GuardPolicy::UNSET;
        p.n_always = self.always.len() as u32;
        p.n_guarded = self.guarded.len() as u32;
        p.n_allowed = allowed.len() as u32;
        p.always[..self.always.len()].copy_from_slice(&self.always);
        p.guarded[..self.guarded.len()].copy_from_slice(&self.guarded);
        for (slot, (major, minor)) in p.allowed.iter_mut().zip(allowed) {
            *slot = kdev(*major, *minor);
        }
        Ok(p)
    }
}

/// A pinned guard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GuardInfo {
    /// The pod's UID (the pin's name).
    pub pod_uid: String,
    /// The pin.
    pub pin: PathBuf,
    /// The link's id.
    pub link_id: u32,
    /// The program's id.
    pub program_id: u32,
    /// The pod cgroup's id, `None` once the cgroup is gone (the kernel
    /// has detached the link).
    pub cgroup_id: Option<u64>,
}

impl GuardInfo {
    /// The guard of pod `pod_uid` pinned at `pin`, from its link's info.
    fn from_link(pod_uid: String, pin: PathBuf, link: &tessera_ebpf_sys::LinkInfo) -> Self {
        Self {
            pod_uid,
            pin,
            link_id: link.id,
            program_id: link.prog_id,
            cgroup_id: (link.cgroup_id != 0).then_some(link.cgroup_id),
        }
    }
}

/// The node's pod guards.
#[derive(Clone, Debug)]
pub struct Guards {
    object: PathBuf,
    pin_dir: PathBuf,
    cgroup_root: PathBuf,
    devices: GuardDevices,
}

/// `/sys/fs/bpf/tessera/<abi>/guard`.
pub fn default_pin_dir() -> PathBuf {
    Path::new(mounts::BPFFS)
        .join("tessera")
        .join(ABI_VERSION.to_string())
        .join("guard")
}

impl Guards {
    /// Guards loading `object` (`tessera-guard.bpf.o`), pinned under
    /// [`default_pin_dir`], for pod cgroups in the cgroup v2 hierarchy.
    pub fn new(object: impl Into<PathBuf>, devices: GuardDevices) -> Result<Self, GuardError> {
        Ok(Self {
            object: object.into(),
            pin_dir: default_pin_dir(),
            cgroup_root: cgroup::cgroup2_root().map_err(GuardError::Cgroup)?,
            devices,
        })
    }

    /// Pins under `dir` instead (on a bpf file system).
    pub fn with_pin_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.pin_dir = dir.into();
        self
    }

    /// Where the pins are.
    pub fn pin_dir(&self) -> &Path {
        &self.pin_dir
    }

    /// The UID of the pod whose cgroup is `pod_cgroup` (a pod-level cgroup
    /// in the v2 hierarchy).
    pub fn pod_uid(&self, pod_cgroup: &Path) -> Result<String, GuardError> {
        let not_pod = |why: String| GuardError::NotPodCgroup {
            path: pod_cgroup.to_owned(),
            why,
        };
        let rel = pod_cgroup
            .strip_prefix(&self.cgroup_root)
            .map_err(|_| not_pod(format!("not under {}", self.cgroup_root.display())))?;
        match classify(&rel.to_string_lossy()) {
            Classified::Pod(pod) => Ok(pod.uid),
            Classified::Container { pod, .. } => Err(not_pod(format!(
                "it is a container cgroup of pod {}; guard the pod cgroup",
                pod.uid
            ))),
            Classified::Unknown { reason } => Err(not_pod(reason)),
            Classified::NotKubernetes | Classified::QosLevel { .. } => {
                Err(not_pod("not a kubepods pod path".into()))
            }
        }
    }

    /// Attaches (or replaces) the guard of the pod whose cgroup is
    /// `pod_cgroup`, allowing the guarded devices `allowed` (major, minor)
    /// and pins it.
    pub fn guard_pod(
        &self,
        pod_cgroup: &Path,
        allowed: &[(u32, u32)],
    ) -> Result<GuardInfo, GuardError> {
        let uid = self.pod_uid(pod_cgroup)?;
        self.guard_cgroup(pod_cgroup, &uid, allowed)
    }

    /// As [`Guards::guard_pod`] for any cgroup, pinned as `name` (1 to 200
    /// ASCII letters, digits, `-` and `_`): the watchdog's deny action on
    /// a container's own cgroup, with its own pin directory.
    pub fn guard_cgroup(
        &self,
        cgroup: &Path,
        name: &str,
        allowed: &[(u32, u32)],
    ) -> Result<GuardInfo, GuardError> {
        if !valid_pin_name(name) {
            return Err(GuardError::BadUid(name.to_owned()));
        }
        let pod_cgroup = cgroup;
        let uid = name.to_owned();
        let policy = self.devices.policy(&uid, allowed)?;
        self.ensure_pin_dir()?;
        let mut ebpf = self.load(&uid, &policy)?;
        let program_err = |source| GuardError::Program {
            pod: uid.clone(),
            source: Box::new(source),
        };
        let program: &mut CgroupDevice = ebpf
            .program_mut(names::PROG_POD_GUARD)
            .ok_or_else(|| GuardError::MissingProgram {
                path: self.object.clone(),
                program: names::PROG_POD_GUARD,
            })?
            .try_into()
            .map_err(program_err)?;
        program.load().map_err(program_err)?;
        let prog_fd = program.fd().map_err(program_err)?;
        let dir = File::open(pod_cgroup).map_err(PathIoError::at("open pod cgroup", pod_cgroup))?;
        let link = tessera_ebpf_sys::cgroup_link_create(
            prog_fd.as_fd(),
            dir.as_fd(),
            tessera_ebpf_sys::BPF_CGROUP_DEVICE,
        )
        .map_err(PathIoError::at("attach device guard to", pod_cgroup))?;
        let pin = self.pin_dir.join(&uid);
        let tmp = self.pin_dir.join(format!("{TMP_PREFIX}{uid}"));
        let _ = std::fs::remove_file(&tmp);
        tessera_ebpf_sys::obj_pin(link.as_fd(), &tmp)
            .map_err(PathIoError::at("pin device guard at", &tmp))?;
        if let Err(source) = std::fs::rename(&tmp, &pin) {
            // Else the temporary pin would hold the new link attached, out
            // of sight of list_guards, unguard_pod and prune.
            let _ = std::fs::remove_file(&tmp);
            return Err(PathIoError::new("rename device guard pin to", pin, source).into());
        }
        let info = tessera_ebpf_sys::link_info(link.as_fd())
            .map_err(PathIoError::at("read link info of", &pin))?;
        tracing::info!(pod = %uid, cgroup = %pod_cgroup.display(), allowed = allowed.len(), "device guard attached");
        Ok(GuardInfo::from_link(uid, pin, &info))
    }

    /// Removes pod `uid`'s guard; returns whether there was one.
    /// Enforcement ends when the kernel lets go of the link, shortly
    /// after this returns: it frees the pin's inode after an RCU grace
    /// period and puts the link from a work queue.
    pub fn unguard_pod(&self, uid: &str) -> Result<bool, GuardError> {
        if !valid_uid(uid) {
            return Err(GuardError::BadUid(uid.to_owned()));
        }
        self.unguard(uid)
    }

    /// Removes the guard pinned as `name` (see [`Guards::guard_cgroup`]);
    /// returns whether there was one.
    pub fn unguard(&self, name: &str) -> Result<bool, GuardError> {
        if !valid_pin_name(name) {
            return Err(GuardError::BadUid(name.to_owned()));
        }
        let uid = name;
        let pin = self.pin_dir.join(uid);
        match std::fs::remove_file(&pin) {
            Ok(()) => {
                tracing::info!(pod = %uid, "device guard removed");
                Ok(true)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(source) => Err(PathIoError::new("remove device guard pin", pin, source).into()),
        }
    }

    /// The pinned guards.
    pub fn list_guards(&self) -> Result<Vec<GuardInfo>, GuardError> {
        let entries = match std::fs::read_dir(&self.pin_dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => {
                return Err(
                    PathIoError::new("list device guard pins in", &self.pin_dir, source).into(),
                );
            }
        };
        let mut out = Vec::new();
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !valid_uid(&name) {
                continue;
            }
            let pin = entry.path();
            let io = |action, source| PathIoError::new(action, &pin, source);
            let link =
                tessera_ebpf_sys::obj_get(&pin).map_err(|e| io("open device guard pin", e))?;
            let info = tessera_ebpf_sys::link_info(link.as_fd())
                .map_err(|e| io("read link info of", e))?;
            out.push(GuardInfo::from_link(name, pin, &info));
        }
        out.sort_by(|a, b| a.pod_uid.cmp(&b.pod_uid));
        Ok(out)
    }

    /// Removes the pins of guards whose pod cgroup is gone, and temporary
    /// pins a replacement left behind (`new-<uid>`: an agent stopped
    /// between pinning and renaming); returns the UIDs of the pods whose
    /// guards went. Not to be run while a [`Guards::guard_pod`] is under
    /// way, whose temporary pin it would remove.
    pub fn prune(&self) -> Result<Vec<String>, GuardError> {
        self.sweep_temporary_pins()?;
        let mut pruned = Vec::new();
        for guard in self.list_guards()? {
            if guard.cgroup_id.is_none() && self.unguard_pod(&guard.pod_uid)? {
                pruned.push(guard.pod_uid);
            }
        }
        Ok(pruned)
    }

    fn sweep_temporary_pins(&self) -> Result<(), GuardError> {
        let entries = match std::fs::read_dir(&self.pin_dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(source) => {
                return Err(
                    PathIoError::new("list device guard pins in", &self.pin_dir, source).into(),
                );
            }
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(uid) = name.strip_prefix(TMP_PREFIX) else {
                continue;
            };
            if !valid_uid(uid) {
                continue;
            }
            match std::fs::remove_file(entry.path()) {
                Ok(()) => tracing::info!(pod = %uid, "stale temporary device guard pin removed"),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(source) => {
                    return Err(
                        PathIoError::new("remove device guard pin", entry.path(), source).into(),
                    );
                }
            }
        }
        Ok(())
    }

    /// Makes the pin directory, first mounting bpffs at
    /// [`mounts::BPFFS`] when the directory is below it and nothing
    /// mounted it yet (a new node, or a container without the host's
    /// bpffs). [`Guards::guard_pod`] calls it; anything else that puts
    /// files into the pin directory must call it first. The reading
    /// methods need not: without bpffs there is no pin to find.
    pub fn ensure_pin_dir(&self) -> Result<(), GuardError> {
        let bpffs = Path::new(mounts::BPFFS);
        if self.pin_dir.starts_with(bpffs) && mounts::ensure_bpffs(bpffs)? {
            tracing::info!(path = mounts::BPFFS, "mounted bpffs");
        }
        std::fs::create_dir_all(&self.pin_dir).map_err(PathIoError::at(
            "create device guard pin directory",
            &self.pin_dir,
        ))?;
        Ok(())
    }

    fn load(&self, uid: &str, policy: &GuardPolicy) -> Result<Ebpf, GuardError> {
        EbpfLoader::new()
            .override_global(names::GUARD_GLOBAL, policy, true)
            .load_file(&self.object)
            .map_err(|source| GuardError::Load {
                path: self.object.clone(),
                pod: uid.to_owned(),
                source: Box::new(source),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const READ: u32 = (2 << 16) | 2;

    #[test]
    fn nvidia_policy_guards_gpus_and_spares_control_and_uvm() {
        let devices = GuardDevices::nvidia(Some(508), Some(509));
        let p = devices.policy("pod", &[(195, 2)]).unwrap();
        assert!(p.allows(READ, 195, 2));
        assert!(!p.allows(READ, 195, 0));
        assert!(!p.allows(READ, 195, GPU_MINOR_MAX));
        assert!(p.allows(READ, 195, 254));
        assert!(p.allows(READ, 195, 255));
        assert!(p.allows(READ, 508, 0));
        assert!(p.allows(READ, 508, 1));
        assert!(!p.allows(READ, 509, 1));
        assert!(p.allows(READ, 1, 3));
    }

    #[test]
    fn stand_in_devices_follow_their_class() {
        let dev = |major, minor, class| Device {
            major,
            minor,
            class,
            label: String::new(),
        };
        let devices = GuardDevices::from_devices(&[
            dev(1, 3, class::CONTROL),
            dev(1, 5, class::GPU),
            dev(1, 7, class::GPU),
            dev(1, 8, class::STAND_IN),
        ]);
        let p = devices.policy("pod", &[(1, 5)]).unwrap();
        assert!(p.allows(READ, 1, 3));
        assert!(p.allows(READ, 1, 5));
        assert!(!p.allows(READ, 1, 7));
        assert!(p.allows(READ, 1, 8));
    }

    #[test]
    fn oversized_policies_are_refused_naming_the_pod() {
        let devices = GuardDevices::nvidia(None, None);
        let many: Vec<(u32, u32)> = (0..=MAX_ALLOWED as u32).map(|m| (195, m)).collect();
        let err = devices.policy("abc", &many).unwrap_err().to_string();
        assert_eq!(
            err,
            format!(
                "device guard policy for pod abc has 33 allowed devices (at most {MAX_ALLOWED})"
            )
        );
    }

    #[test]
    fn pod_uid_comes_from_a_pod_level_path() {
        let guards = Guards {
            object: PathBuf::new(),
            pin_dir: PathBuf::new(),
            cgroup_root: PathBuf::from("/sys/fs/cgroup"),
            devices: GuardDevices::default(),
        };
        let uid = "7b2f3c1e-9d4a-4e5b-8c6d-0f1a2b3c4d5e";
        let pod = format!(
            "/sys/fs/cgroup/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice",
            uid.replace('-', "_")
        );
        assert_eq!(guards.pod_uid(Path::new(&pod)).unwrap(), uid);
        let cid = "a".repeat(64);
        let ctr = format!("{pod}/cri-containerd-{cid}.scope");
        let err = guards.pod_uid(Path::new(&ctr)).unwrap_err().to_string();
        assert!(err.contains("is a container cgroup of pod"), "{err}");
        let err = guards
            .pod_uid(Path::new("/sys/fs/cgroup/system.slice"))
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "/sys/fs/cgroup/system.slice is not a pod cgroup: not a kubepods pod path"
        );
        let err = guards.pod_uid(Path::new("/tmp/x")).unwrap_err().to_string();
        assert!(err.contains("not under /sys/fs/cgroup"), "{err}");
        assert!(matches!(
            guards.unguard_pod("../../etc"),
            Err(GuardError::BadUid(_))
        ));
    }
}
