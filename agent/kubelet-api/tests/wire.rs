//! The generated messages against protobuf bytes computed by hand from the
//! field tables (tag byte = field number << 3 | wire type; 0 varint, 2
//! length-delimited). A wrong field number, type or package fails here.
#![allow(clippy::unwrap_used, reason = "test code")]

use std::collections::HashMap;

use prost::Message;
use tessera_kubelet_api::deviceplugin::v1beta1 as dp;
use tessera_kubelet_api::dra::v1 as dra;
use tessera_kubelet_api::pluginregistration::v1 as reg;
use tessera_kubelet_api::podresources::v1 as pr;

fn enc(m: &impl Message) -> Vec<u8> {
    m.encode_to_vec()
}

#[test]
fn register_request_fields_1_to_4() {
    let m = dp::RegisterRequest {
        version: "v1beta1".into(),
        endpoint: "t.sock".into(),
        resource_name: "a/b".into(),
        options: Some(dp::DevicePluginOptions {
            pre_start_required: false,
            get_preferred_allocation_available: true,
        }),
    };
    let mut want = vec![0x0a, 7];
    want.extend(b"v1beta1");
    want.extend([0x12, 6]);
    want.extend(b"t.sock");
    want.extend([0x1a, 3]);
    want.extend(b"a/b");
    // options (4): get_preferred_allocation_available is field 2, varint.
    want.extend([0x22, 2, 0x10, 1]);
    assert_eq!(enc(&m), want);
    let pre = dp::DevicePluginOptions {
        pre_start_required: true,
        get_preferred_allocation_available: false,
    };
    assert_eq!(enc(&pre), [0x08, 1]);
    assert_eq!(dp::RegisterRequest::decode(&want[..]).unwrap(), m);
}

#[test]
fn list_and_watch_device_with_topology() {
    let m = dp::ListAndWatchResponse {
        devices: vec![dp::Device {
            id: "g::0".into(),
            health: "Healthy".into(),
            topology: Some(dp::TopologyInfo {
                nodes: vec![dp::NumaNode { id: 1 }],
            }),
        }],
    };
    let mut dev = vec![0x0a, 4];
    dev.extend(b"g::0");
    dev.extend([0x12, 7]);
    dev.extend(b"Healthy");
    // topology (3) { nodes (1) { ID (1) = 1 } }
    dev.extend([0x1a, 4, 0x0a, 2, 0x08, 1]);
    let mut want = vec![0x0a, dev.len() as u8];
    want.extend(&dev);
    assert_eq!(enc(&m), want);
}

#[test]
fn preferred_allocation_fields() {
    let m = dp::PreferredAllocationRequest {
        container_requests: vec![dp::ContainerPreferredAllocationRequest {
            available_device_i_ds: vec!["a".into()],
            must_include_device_i_ds: vec!["b".into()],
            allocation_size: 2,
        }],
    };
    let inner = [0x0a, 1, b'a', 0x12, 1, b'b', 0x18, 2];
    let mut want = vec![0x0a, inner.len() as u8];
    want.extend(inner);
    assert_eq!(enc(&m), want);
    let r = dp::PreferredAllocationResponse {
        container_responses: vec![dp::ContainerPreferredAllocationResponse {
            device_i_ds: vec!["x".into()],
        }],
    };
    assert_eq!(enc(&r), [0x0a, 3, 0x0a, 1, b'x']);
}

#[test]
fn allocate_request_and_response_fields() {
    let req = dp::AllocateRequest {
        container_requests: vec![dp::ContainerAllocateRequest {
            devices_ids: vec!["d".into()],
        }],
    };
    assert_eq!(enc(&req), [0x0a, 3, 0x0a, 1, b'd']);
    let pre = dp::PreStartContainerRequest {
        devices_ids: vec!["x".into()],
    };
    assert_eq!(enc(&pre), [0x0a, 1, b'x']);

    let resp = dp::ContainerAllocateResponse {
        envs: HashMap::from([("K".into(), "V".into())]),
        mounts: vec![dp::Mount {
            container_path: "/c".into(),
            host_path: "/h".into(),
            read_only: true,
        }],
        devices: vec![dp::DeviceSpec {
            container_path: "/d".into(),
            host_path: "/e".into(),
            permissions: "rw".into(),
        }],
        annotations: HashMap::from([("A".into(), "B".into())]),
        cdi_devices: vec![dp::CdiDevice {
            name: "v/g=x".into(),
        }],
    };
    let mut want = vec![0x0a, 6, 0x0a, 1, b'K', 0x12, 1, b'V'];
    want.extend([0x12, 10, 0x0a, 2, b'/', b'c', 0x12, 2, b'/', b'h', 0x18, 1]);
    want.extend([0x1a, 12, 0x0a, 2, b'/', b'd', 0x12, 2, b'/', b'e', 0x1a, 2]);
    want.extend(b"rw");
    want.extend([0x22, 6, 0x0a, 1, b'A', 0x12, 1, b'B']);
    want.extend([0x2a, 7, 0x0a, 5]);
    want.extend(b"v/g=x");
    assert_eq!(enc(&resp), want);
    let all = dp::AllocateResponse {
        container_responses: vec![resp],
    };
    assert_eq!(enc(&all)[..2], [0x0a, want.len() as u8]);
}

#[test]
fn pod_resources_list_nesting() {
    let m = pr::ListPodResourcesResponse {
        pod_resources: vec![pr::PodResources {
            name: "p".into(),
            namespace: "n".into(),
            containers: vec![pr::ContainerResources {
                name: "c".into(),
                devices: vec![pr::ContainerDevices {
                    resource_name: "r".into(),
                    device_ids: vec!["d".into()],
                    topology: Some(pr::TopologyInfo {
                        nodes: vec![pr::NumaNode { id: 0 }],
                    }),
                }],
                cpu_ids: vec![3],
                ..Default::default()
            }],
            ..Default::default()
        }],
    };
    // ContainerDevices: resource_name (1), device_ids (2), topology (3)
    // holding one NUMANode whose ID 0 encodes as an empty message.
    let devices = [0x0a, 1, b'r', 0x12, 1, b'd', 0x1a, 2, 0x0a, 0];
    // ContainerResources: name (1), devices (2), cpu_ids (3) packed.
    let mut container = vec![0x0a, 1, b'c', 0x12, devices.len() as u8];
    container.extend(devices);
    container.extend([0x1a, 1, 3]);
    // PodResources: name (1), namespace (2), containers (3).
    let mut pod = vec![0x0a, 1, b'p', 0x12, 1, b'n', 0x1a, container.len() as u8];
    pod.extend(&container);
    let mut want = vec![0x0a, pod.len() as u8];
    want.extend(&pod);
    assert_eq!(enc(&m), want);
}

#[test]
fn pod_resources_other_messages() {
    let get = pr::GetPodResourcesRequest {
        pod_name: "a".into(),
        pod_namespace: "b".into(),
    };
    assert_eq!(enc(&get), [0x0a, 1, b'a', 0x12, 1, b'b']);
    let alloc = pr::AllocatableResourcesResponse {
        cpu_ids: vec![1, 2],
        ..Default::default()
    };
    assert_eq!(enc(&alloc), [0x12, 2, 1, 2]);
    let mem = pr::ContainerMemory {
        memory_type: "m".into(),
        size: 5,
        topology: None,
    };
    assert_eq!(enc(&mem), [0x0a, 1, b'm', 0x10, 5]);
    // DynamicResource starts at field 2 (1 is retired).
    let dynres = pr::DynamicResource {
        claim_name: "x".into(),
        ..Default::default()
    };
    assert_eq!(enc(&dynres), [0x12, 1, b'x']);
    // share_id (5) is `optional`: present even when empty.
    let claim = pr::ClaimResource {
        share_id: Some(String::new()),
        ..Default::default()
    };
    assert_eq!(enc(&claim), [0x2a, 0]);
    let pod = pr::PodResources {
        cpu_ids: vec![7],
        ..Default::default()
    };
    assert_eq!(enc(&pod), [0x22, 1, 7]);
}

#[test]
fn grpc_service_names_carry_the_kubelet_packages() {
    assert_eq!(
        dp::registration_server::SERVICE_NAME,
        "v1beta1.Registration"
    );
    assert_eq!(
        dp::device_plugin_server::SERVICE_NAME,
        "v1beta1.DevicePlugin"
    );
    assert_eq!(
        pr::pod_resources_lister_server::SERVICE_NAME,
        "v1.PodResourcesLister"
    );
    assert_eq!(
        reg::registration_server::SERVICE_NAME,
        "pluginregistration.Registration"
    );
    assert_eq!(
        dra::dra_plugin_server::SERVICE_NAME,
        "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"
    );
    assert_eq!(
        tessera_kubelet_api::deviceplugin::KUBELET_SOCKET,
        format!(
            "{}{}",
            tessera_kubelet_api::deviceplugin::DEVICE_PLUGIN_PATH,
            tessera_kubelet_api::deviceplugin::KUBELET_SOCKET_NAME
        )
    );
}

#[test]
fn plugin_info_and_registration_status_fields() {
    let m = reg::PluginInfo {
        r#type: "DRAPlugin".into(),
        name: "g".into(),
        endpoint: "/s".into(),
        supported_versions: vec!["v1.DRAPlugin".into()],
    };
    let mut want = vec![0x0a, 9];
    want.extend(b"DRAPlugin");
    want.extend([0x12, 1, b'g', 0x1a, 2, b'/', b's', 0x22, 12]);
    want.extend(b"v1.DRAPlugin");
    assert_eq!(enc(&m), want);
    let status = reg::RegistrationStatus {
        plugin_registered: true,
        error: "e".into(),
    };
    assert_eq!(enc(&status), [0x08, 1, 0x12, 1, b'e']);
}

#[test]
fn dra_prepare_request_and_response_fields() {
    let req = dra::NodePrepareResourcesRequest {
        claims: vec![dra::Claim {
            namespace: "n".into(),
            uid: "u".into(),
            name: "c".into(),
        }],
    };
    // claims (1) { namespace (1), uid (2), name (3) }
    assert_eq!(
        enc(&req),
        [0x0a, 9, 0x0a, 1, b'n', 0x12, 1, b'u', 0x1a, 1, b'c']
    );
    let resp = dra::NodePrepareResourcesResponse {
        claims: [(
            "u".to_owned(),
            dra::NodePrepareResourceResponse {
                devices: vec![dra::Device {
                    request_names: vec!["r".into()],
                    pool_name: "p".into(),
                    device_name: "d".into(),
                    cdi_device_ids: vec!["x".into()],
                }],
                error: "e".into(),
            },
        )]
        .into(),
    };
    // device: request_names (1), pool_name (2), device_name (3), cdi (4)
    let device = [0x0a, 1, b'r', 0x12, 1, b'p', 0x1a, 1, b'd', 0x22, 1, b'x'];
    // value: devices (1), error (2)
    let mut value = vec![0x0a, device.len() as u8];
    value.extend(device);
    value.extend([0x12, 1, b'e']);
    // map entry: key (1), value (2)
    let mut entry = vec![0x0a, 1, b'u', 0x12, value.len() as u8];
    entry.extend(value);
    let mut want = vec![0x0a, entry.len() as u8];
    want.extend(entry);
    assert_eq!(enc(&resp), want);
    let unprepare = dra::NodeUnprepareResourcesResponse {
        claims: [(
            "u".to_owned(),
            dra::NodeUnprepareResourceResponse { error: "e".into() },
        )]
        .into(),
    };
    assert_eq!(
        enc(&unprepare),
        [0x0a, 8, 0x0a, 1, b'u', 0x12, 3, 0x0a, 1, b'e']
    );
}
