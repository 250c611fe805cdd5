//! The committed CRD is the one the Rust types render, and it says what
//! operators and the API server rely on.

use std::path::PathBuf;

fn committed() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy/crds/gpunodes.tessera.dev.yaml")
}

#[test]
fn committed_crd_matches_the_types() {
    let rendered = tessera_api::crd::gpunode_file().unwrap();
    let path = committed();
    if std::env::var_os("TESSERA_BLESS").is_some() {
        std::fs::write(&path, &rendered).unwrap();
        eprintln!("wrote {}", path.display());
        return;
    }
    let on_disk =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    if on_disk != rendered {
        let first = on_disk
            .lines()
            .zip(rendered.lines())
            .position(|(a, b)| a != b)
            .map_or_else(|| "length".to_owned(), |i| format!("line {}", i + 1));
        panic!(
            "{} differs from what tessera-api renders (first difference: {first}); \
             run `TESSERA_BLESS=1 cargo test -p tessera-api --test crd_drift` and commit the file",
            path.display()
        );
    }
}

#[test]
fn crd_is_cluster_scoped_with_status_and_printer_columns() {
    let crd = tessera_api::crd::gpunode();
    let v: serde_json::Value = serde_json::to_value(&crd).unwrap();
    assert_eq!(v["metadata"]["name"], "gpunodes.tessera.dev");
    assert_eq!(v["spec"]["scope"], "Cluster");
    assert_eq!(v["spec"]["names"]["shortNames"][0], "gpun");
    let version = &v["spec"]["versions"][0];
    assert_eq!(version["name"], "v1alpha1");
    assert!(version["subresources"]["status"].is_object());
    let columns: Vec<&str> = version["additionalPrinterColumns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    for want in [
        "GPUs",
        "Healthy",
        "Model",
        "Memory-MiB",
        "Used-MiB",
        "SM-Util",
        "Pods",
    ] {
        assert!(columns.contains(&want), "{want} missing from {columns:?}");
    }
    // Every column's path exists in the schema.
    let status = &version["schema"]["openAPIV3Schema"]["properties"]["status"];
    for c in version["additionalPrinterColumns"].as_array().unwrap() {
        let path = c["jsonPath"].as_str().unwrap();
        let Some(rest) = path.strip_prefix(".status.") else {
            continue;
        };
        let mut node = status;
        for part in rest.split('.') {
            node = &node["properties"][part];
            assert!(
                node.is_object(),
                "printer column {path}: no {part} in the schema"
            );
        }
    }
    let devices = &status["properties"]["devices"];
    assert_eq!(devices["x-kubernetes-list-type"], "map");
    assert_eq!(devices["x-kubernetes-list-map-keys"][0], "uuid");
    assert_eq!(devices["maxItems"], 64);
    let uuid = &devices["items"]["properties"]["uuid"];
    assert_eq!(uuid["pattern"], tessera_api::uuid::PATTERN);
    let required: Vec<&str> = status["required"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap())
        .collect();
    assert!(
        required.contains(&"devices") && required.contains(&"updatedAt"),
        "{required:?}"
    );
}

#[test]
fn a_status_round_trips_and_bad_uuids_are_refused() {
    let json = serde_json::json!({
        "apiVersion": "tessera.dev/v1alpha1",
        "kind": "GpuNode",
        "metadata": {"name": "node-a"},
        "spec": {},
        "status": {
            "updatedAt": "2026-12-01T09:00:00Z",
            "summary": {"gpus": 1, "healthyGpus": 1, "model": "NVIDIA H100 80GB HBM3",
                        "memoryMiB": 81559, "allocatedMemoryMiB": 4000, "usedMemoryMiB": 3100,
                        "smUtilPercent": 30, "pods": 1},
            "devices": [{"uuid": "GPU-5f8b9d2e-1c3a-4e6f-8a9b-0c1d2e3f4a5b", "index": 0,
                         "model": "NVIDIA H100 80GB HBM3", "memoryMiB": 81559, "smCount": 132,
                         "numaNode": 0, "health": "Healthy"}],
            "allocations": [{"device": "GPU-5f8b9d2e-1c3a-4e6f-8a9b-0c1d2e3f4a5b",
                             "namespace": "ml", "pod": "train-0", "container": "main",
                             "memoryMiB": 4000, "coresPercent": 30, "computeMode": "hard"}],
        }
    });
    let node: tessera_api::GpuNode = serde_json::from_value(json.clone()).unwrap();
    let status = node.status.as_ref().unwrap();
    assert_eq!(status.devices[0].sm_count, 132);
    assert_eq!(
        status.allocations[0].compute_mode,
        Some(tessera_api::gpunode::ComputeMode::Hard)
    );
    assert_eq!(serde_json::to_value(&node).unwrap(), json);

    let mut bad = json;
    bad["status"]["devices"][0]["uuid"] = "GPU-xyz".into();
    let e = serde_json::from_value::<tessera_api::GpuNode>(bad).unwrap_err();
    assert!(
        e.to_string().contains("\"GPU-xyz\" is not a GPU UUID"),
        "{e}"
    );
}
