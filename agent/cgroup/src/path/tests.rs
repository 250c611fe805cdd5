//! Fixtures: one path per driver × runtime × QoS pattern, as kubelet and
//! the runtimes create them, plus paths that must stay unknown.

use super::*;

const UID: &str = "7b2f3c1e-9d4a-4e5b-8c6d-0f1a2b3c4d5e";
const UID_ESC: &str = "7b2f3c1e_9d4a_4e5b_8c6d_0f1a2b3c4d5e";
const CID: &str = "4f6c2b0e9a8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a291807f6e5d4c3b2a19080";

fn pod(qos: QosClass, driver: Driver) -> PodRef {
    PodRef {
        uid: UID.into(),
        qos,
        driver,
    }
}

fn container(
    qos: QosClass,
    driver: Driver,
    runtime: Option<Runtime>,
    conmon: bool,
    nested: &str,
) -> Classified {
    Classified::Container {
        pod: pod(qos, driver),
        container: ContainerRef {
            id: CID.into(),
            runtime,
            conmon,
            nested: nested.into(),
        },
    }
}

fn assert_unknown(path: &str, needle: &str) {
    match classify(path) {
        Classified::Unknown { reason } => {
            assert!(
                reason.contains(needle),
                "{path}: reason {reason:?} lacks {needle:?}"
            )
        }
        other => panic!("{path}: expected unknown, got {other:?}"),
    }
}

#[test]
fn systemd_containerd_every_qos_class() {
    use Driver::Systemd;
    use QosClass::*;
    let burstable = format!(
        "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_ESC}.slice/cri-containerd-{CID}.scope"
    );
    assert_eq!(
        classify(&burstable),
        container(Burstable, Systemd, Some(Runtime::Containerd), false, "")
    );
    let besteffort = format!(
        "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_ESC}.slice/cri-containerd-{CID}.scope"
    );
    assert_eq!(
        classify(&besteffort),
        container(BestEffort, Systemd, Some(Runtime::Containerd), false, "")
    );
    let guaranteed =
        format!("/kubepods.slice/kubepods-pod{UID_ESC}.slice/cri-containerd-{CID}.scope");
    assert_eq!(
        classify(&guaranteed),
        container(Guaranteed, Systemd, Some(Runtime::Containerd), false, "")
    );
    // The pod level itself.
    assert_eq!(
        classify(&format!("/kubepods.slice/kubepods-pod{UID_ESC}.slice")),
        Classified::Pod(pod(Guaranteed, Systemd))
    );
    assert_eq!(
        classify(&format!(
            "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_ESC}.slice"
        )),
        Classified::Pod(pod(Burstable, Systemd))
    );
}

#[test]
fn systemd_crio_and_conmon_and_cri_dockerd() {
    use Driver::Systemd;
    use QosClass::*;
    let base =
        format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_ESC}.slice");
    assert_eq!(
        classify(&format!("{base}/crio-{CID}.scope")),
        container(Burstable, Systemd, Some(Runtime::CriO), false, "")
    );
    assert_eq!(
        classify(&format!("{base}/crio-conmon-{CID}.scope")),
        container(Burstable, Systemd, Some(Runtime::CriO), true, "")
    );
    // crun/CRI-O may put the payload one level down, in `container`.
    assert_eq!(
        classify(&format!("{base}/crio-{CID}.scope/container")),
        container(Burstable, Systemd, Some(Runtime::CriO), false, "container")
    );
    assert_eq!(
        classify(&format!("{base}/docker-{CID}.scope")),
        container(Burstable, Systemd, Some(Runtime::Docker), false, "")
    );
}

#[test]
fn systemd_under_a_cgroup_root_prefix() {
    // kubelet --cgroup-root=/kubelet.slice (e.g. kind nodes).
    let path = format!(
        "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{UID_ESC}.slice/cri-containerd-{CID}.scope"
    );
    assert_eq!(
        classify(&path),
        container(
            QosClass::BestEffort,
            Driver::Systemd,
            Some(Runtime::Containerd),
            false,
            ""
        )
    );
}

#[test]
fn cgroupfs_containerd_and_crio_every_qos_class() {
    use Driver::Cgroupfs;
    use QosClass::*;
    assert_eq!(
        classify(&format!("/kubepods/burstable/pod{UID}/{CID}")),
        container(Burstable, Cgroupfs, None, false, "")
    );
    assert_eq!(
        classify(&format!("/kubepods/besteffort/pod{UID}/{CID}")),
        container(BestEffort, Cgroupfs, None, false, "")
    );
    assert_eq!(
        classify(&format!("/kubepods/pod{UID}/{CID}")),
        container(Guaranteed, Cgroupfs, None, false, "")
    );
    assert_eq!(
        classify(&format!("/kubepods/pod{UID}/crio-{CID}")),
        container(Guaranteed, Cgroupfs, Some(Runtime::CriO), false, "")
    );
    assert_eq!(
        classify(&format!("/kubepods/burstable/pod{UID}/crio-conmon-{CID}")),
        container(Burstable, Cgroupfs, Some(Runtime::CriO), true, "")
    );
    assert_eq!(
        classify(&format!("/kubepods/besteffort/pod{UID}")),
        Classified::Pod(pod(BestEffort, Cgroupfs))
    );
    // Anywhere below the root, e.g. a test or a --cgroup-root prefix.
    assert_eq!(
        classify(&format!("/tessera-test-1/kubepods/pod{UID}/{CID}/sub")),
        container(Guaranteed, Cgroupfs, None, false, "sub")
    );
}

#[test]
fn static_pod_uids_are_hashes() {
    let hash = "3f4e9a1b2c3d4e5f60718293a4b5c6d7";
    let path = format!("/kubepods.slice/kubepods-pod{hash}.slice");
    assert_eq!(classify(&path).pod().map(|p| p.uid.as_str()), Some(hash));
    assert_eq!(
        classify(&format!("/kubepods/burstable/pod{hash}"))
            .pod()
            .map(|p| p.qos),
        Some(QosClass::Burstable)
    );
}

#[test]
fn kubepods_and_qos_levels() {
    assert_eq!(
        classify("/kubepods.slice"),
        Classified::QosLevel {
            qos: None,
            driver: Driver::Systemd
        }
    );
    assert_eq!(
        classify("/kubepods.slice/kubepods-besteffort.slice"),
        Classified::QosLevel {
            qos: Some(QosClass::BestEffort),
            driver: Driver::Systemd
        }
    );
    assert_eq!(
        classify("/kubepods/burstable"),
        Classified::QosLevel {
            qos: Some(QosClass::Burstable),
            driver: Driver::Cgroupfs
        }
    );
}

#[test]
fn system_cgroups_are_not_kubernetes() {
    for path in [
        "/",
        "",
        "/system.slice/containerd.service",
        "/system.slice/kubelet.service",
        "/user.slice/user-1000.slice/session-3.scope",
        "/init.scope",
        // Names that merely contain the word.
        "/system.slice/kubepods-exporter.service",
        "/mykubepods/pod1",
    ] {
        assert_eq!(classify(path), Classified::NotKubernetes, "{path}");
    }
}

#[test]
fn unknown_paths_are_reported_not_guessed() {
    let base =
        format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_ESC}.slice");
    // Unknown runtime prefix.
    assert_unknown(&format!("{base}/runc-{CID}.scope"), "no known runtime");
    // Not a scope.
    assert_unknown(
        &format!("{base}/cri-containerd-{CID}"),
        "not a container scope",
    );
    // Short container id.
    assert_unknown(&format!("{base}/cri-containerd-abc123.scope"), "64-hex");
    // Unescaped dash in a systemd pod slice.
    assert_unknown(
        &format!("/kubepods.slice/kubepods-pod{UID}.slice"),
        "unescaped '-'",
    );
    // Not a uid.
    assert_unknown(
        "/kubepods.slice/kubepods-podxyz.slice",
        "does not hold a pod uid",
    );
    // A pod slice of another QoS class under burstable.
    assert_unknown(
        &format!("/kubepods.slice/kubepods-burstable.slice/kubepods-besteffort-pod{UID_ESC}.slice"),
        "pod slice",
    );
    assert_unknown("/kubepods.slice/system-extra.slice", "neither a QoS slice");
    assert_unknown("/kubepods/guaranteed/pod1", "neither a QoS class");
    assert_unknown("/kubepods/burstable/podnot-a-uid", "not a pod<uid>");
    assert_unknown(
        &format!("/kubepods/pod{UID}/notacontainer"),
        "not a container id",
    );
    // Upper-case container ids are not what runtimes write.
    assert_unknown(
        &format!("/kubepods/pod{UID}/{}", CID.to_uppercase()),
        "not a container id",
    );
}

#[test]
fn uid_and_container_id_shapes() {
    assert!(valid_uid(UID));
    assert!(valid_uid("3f4e9a1b2c3d4e5f60718293a4b5c6d7"));
    assert!(!valid_uid("7b2f3c1e-9d4a-4e5b-8c6d"));
    assert!(!valid_uid("7b2f3c1e-9d4a-4e5b-8c6d-0f1a2b3c4d5g"));
    assert!(!valid_uid(""));
    assert!(valid_container_id(CID));
    assert!(!valid_container_id(&CID[1..]));
}
