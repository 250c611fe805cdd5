//! Parsing kubelet's cgroup paths (relative to the cgroup root) into pod,
//! container and QoS class.
//!
//! Patterns (`pkg/kubelet/cm/cgroup_manager_linux.go`, `reference/ebpf.md`
//! §5), `<uid>` a pod UID and `<id>` a 64-hex container id:
//!
//! | driver | level | name |
//! |---|---|---|
//! | systemd | root | `kubepods.slice` (or `<prefix>-kubepods.slice` under a `--cgroup-root`) |
//! | | QoS | `kubepods-burstable.slice`, `kubepods-besteffort.slice`; Guaranteed pods sit directly under the root |
//! | | pod | `kubepods-burstable-pod<uid with '-' escaped to '_'>.slice` (`kubepods-pod….slice` for Guaranteed) |
//! | | container | `cri-containerd-<id>.scope`, `crio-<id>.scope`, `crio-conmon-<id>.scope`, `docker-<id>.scope` |
//! | cgroupfs | root | `kubepods` |
//! | | QoS | `burstable`, `besteffort`; Guaranteed pods directly under the root |
//! | | pod | `pod<uid>` |
//! | | container | `<id>` (containerd, cri-dockerd), `crio-<id>`, `crio-conmon-<id>` |
//!
//! Cgroups below a container's (a container that makes its own, or a
//! runtime's `container` leaf) belong to that container. The pause
//! (sandbox) container is a container like any other here; the path alone
//! cannot tell it apart.

use std::fmt;

/// A pod's QoS class, which decides its cgroup's parent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QosClass {
    /// Directly under the kubepods root.
    Guaranteed,
    /// Under `burstable`.
    Burstable,
    /// Under `besteffort`.
    BestEffort,
}

/// kubelet's cgroup driver, as the path shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Driver {
    /// systemd slices and scopes.
    Systemd,
    /// Plain directories.
    Cgroupfs,
}

/// The container runtime, as the container cgroup's name shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Runtime {
    /// `cri-containerd-<id>.scope`.
    Containerd,
    /// `crio-<id>` (and `crio-conmon-<id>` for the monitor).
    CriO,
    /// `docker-<id>.scope` (cri-dockerd with systemd).
    Docker,
}

/// A pod cgroup.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PodRef {
    /// The pod's UID, with dashes (`metadata.uid`).
    pub uid: String,
    /// Its QoS class.
    pub qos: QosClass,
    /// The driver that named it.
    pub driver: Driver,
}

/// A container cgroup.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ContainerRef {
    /// The 64-hex container id.
    pub id: String,
    /// The runtime, where the name tells it: a bare cgroupfs id may be
    /// containerd's or cri-dockerd's.
    pub runtime: Option<Runtime>,
    /// CRI-O's `conmon` monitor rather than the container itself.
    pub conmon: bool,
    /// The path below the container's cgroup, empty for the cgroup itself.
    pub nested: String,
}

/// What a cgroup path is.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Classified {
    /// Not under a kubepods root (system services, sessions, the root).
    NotKubernetes,
    /// The kubepods root or a QoS-class cgroup; `None` for the root.
    QosLevel {
        /// The QoS class the level holds, `None` for the root.
        qos: Option<QosClass>,
        /// The driver.
        driver: Driver,
    },
    /// A pod's cgroup.
    Pod(PodRef),
    /// A container's cgroup (or one below it).
    Container {
        /// Its pod.
        pod: PodRef,
        /// The container.
        container: ContainerRef,
    },
    /// Under kubepods, matching no known pattern.
    Unknown {
        /// Why.
        reason: String,
    },
}

impl Classified {
    /// The pod, for a pod or container cgroup.
    pub fn pod(&self) -> Option<&PodRef> {
        match self {
            Self::Pod(pod) | Self::Container { pod, .. } => Some(pod),
            _ => None,
        }
    }
}

impl fmt::Display for QosClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Guaranteed => "guaranteed",
            Self::Burstable => "burstable",
            Self::BestEffort => "besteffort",
        })
    }
}

/// Classifies `path`, a cgroup path relative to the cgroup root (a
/// leading `/` is optional).
pub fn classify(path: &str) -> Classified {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    let Some(root) = parts.iter().position(|p| is_kubepods_root(p)) else {
        return Classified::NotKubernetes;
    };
    let rest = &parts[root + 1..];
    if parts[root].ends_with(".slice") {
        let prefix = parts[root].trim_end_matches(".slice");
        systemd(prefix, rest)
    } else {
        cgroupfs(rest)
    }
}

fn is_kubepods_root(part: &str) -> bool {
    part == "kubepods" || part == "kubepods.slice" || part.ends_with("-kubepods.slice")
}

fn unknown(reason: impl Into<String>) -> Classified {
    Classified::Unknown {
        reason: reason.into(),
    }
}

fn systemd(prefix: &str, rest: &[&str]) -> Classified {
    let driver = Driver::Systemd;
    let Some(first) = rest.first() else {
        return Classified::QosLevel { qos: None, driver };
    };
    let (qos, qos_prefix, pod_at) = if *first == format!("{prefix}-burstable.slice") {
        (QosClass::Burstable, format!("{prefix}-burstable"), 1)
    } else if *first == format!("{prefix}-besteffort.slice") {
        (QosClass::BestEffort, format!("{prefix}-besteffort"), 1)
    } else if first.starts_with(&format!("{prefix}-pod")) {
        (QosClass::Guaranteed, prefix.to_owned(), 0)
    } else {
        return unknown(format!(
            "{first:?} under {prefix}.slice is neither a QoS slice nor a pod slice"
        ));
    };
    let Some(pod_part) = rest.get(pod_at) else {
        return Classified::QosLevel {
            qos: Some(qos),
            driver,
        };
    };
    let Some(escaped) = pod_part
        .strip_prefix(&format!("{qos_prefix}-pod"))
        .and_then(|s| s.strip_suffix(".slice"))
    else {
        return unknown(format!(
            "{pod_part:?} is not a {qos_prefix}-pod<uid>.slice pod slice"
        ));
    };
    if escaped.contains('-') {
        return unknown(format!(
            "pod slice {pod_part:?} has an unescaped '-' in its uid"
        ));
    }
    let uid = escaped.replace('_', "-");
    if !valid_uid(&uid) {
        return unknown(format!("pod slice {pod_part:?} does not hold a pod uid"));
    }
    let pod = PodRef { uid, qos, driver };
    let below = &rest[pod_at + 1..];
    let Some(container_part) = below.first() else {
        return Classified::Pod(pod);
    };
    let Some(scope) = container_part.strip_suffix(".scope") else {
        return unknown(format!(
            "{container_part:?} in pod slice {pod_part:?} is not a container scope"
        ));
    };
    const SCOPES: [(&str, Runtime, bool); 4] = [
        ("cri-containerd-", Runtime::Containerd, false),
        ("crio-conmon-", Runtime::CriO, true),
        ("crio-", Runtime::CriO, false),
        ("docker-", Runtime::Docker, false),
    ];
    let parsed = SCOPES.iter().find_map(|(prefix, runtime, conmon)| {
        scope.strip_prefix(prefix).map(|id| (id, *runtime, *conmon))
    });
    match parsed {
        Some((id, runtime, conmon)) if valid_container_id(id) => Classified::Container {
            pod,
            container: ContainerRef {
                id: id.to_owned(),
                runtime: Some(runtime),
                conmon,
                nested: below[1..].join("/"),
            },
        },
        Some(_) => unknown(format!(
            "container scope {container_part:?} does not hold a 64-hex container id"
        )),
        None => unknown(format!(
            "container scope {container_part:?} names no known runtime (cri-containerd, crio, docker)"
        )),
    }
}

fn cgroupfs(rest: &[&str]) -> Classified {
    let driver = Driver::Cgroupfs;
    let Some(first) = rest.first() else {
        return Classified::QosLevel { qos: None, driver };
    };
    let (qos, pod_at) = match *first {
        "burstable" => (QosClass::Burstable, 1),
        "besteffort" => (QosClass::BestEffort, 1),
        p if p.starts_with("pod") => (QosClass::Guaranteed, 0),
        other => {
            return unknown(format!(
                "{other:?} under kubepods is neither a QoS class nor a pod"
            ));
        }
    };
    let Some(pod_part) = rest.get(pod_at) else {
        return Classified::QosLevel {
            qos: Some(qos),
            driver,
        };
    };
    let uid = match pod_part.strip_prefix("pod") {
        Some(uid) if valid_uid(uid) => uid.to_owned(),
        _ => return unknown(format!("{pod_part:?} is not a pod<uid> pod cgroup")),
    };
    let pod = PodRef { uid, qos, driver };
    let below = &rest[pod_at + 1..];
    let Some(container_part) = below.first() else {
        return Classified::Pod(pod);
    };
    let (id, runtime, conmon) = if let Some(id) = container_part.strip_prefix("crio-conmon-") {
        (id, Some(Runtime::CriO), true)
    } else if let Some(id) = container_part.strip_prefix("crio-") {
        (id, Some(Runtime::CriO), false)
    } else {
        (*container_part, None, false)
    };
    if !valid_container_id(id) {
        return unknown(format!(
            "{container_part:?} in pod cgroup {pod_part:?} is not a container id"
        ));
    }
    Classified::Container {
        pod,
        container: ContainerRef {
            id: id.to_owned(),
            runtime,
            conmon,
            nested: below[1..].join("/"),
        },
    }
}

/// A pod UID: a UUID (8-4-4-4-12 hex), or 32 hex digits (static pods get
/// a hash of their manifest).
pub fn valid_uid(uid: &str) -> bool {
    let hex = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit());
    let groups: Vec<&str> = uid.split('-').collect();
    match groups.as_slice() {
        [one] => one.len() == 32 && hex(one),
        [a, b, c, d, e] => {
            [a.len(), b.len(), c.len(), d.len(), e.len()] == [8, 4, 4, 4, 12]
                && groups.iter().all(|g| hex(g))
        }
        _ => false,
    }
}

/// A container id: 64 lower-case hex digits.
pub fn valid_container_id(id: &str) -> bool {
    id.len() == 64 && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

#[cfg(test)]
mod tests;
