use super::*;

const A100: &str = "GPU-5e1a0000-0000-4000-8000-000051510000";
const H100: &str = "GPU-5e1a0000-0000-4000-8000-000051510001";

fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn errors(pairs: &[(&str, &str)]) -> Vec<String> {
    parse(&annotations(pairs))
        .unwrap_err()
        .iter()
        .map(ToString::to_string)
        .collect()
}

#[test]
fn no_annotations_give_defaults() {
    let policy = parse(&annotations(&[("app.kubernetes.io/name", "x")])).unwrap();
    assert_eq!(policy, GpuPolicy::default());
    assert_eq!(policy.placement, Placement::Fragmentation);
    assert!(!policy.numa_bind);
    assert!(policy.admits(A100, "NVIDIA A100-SXM4-80GB"));
}

#[test]
fn every_key_is_read() {
    let policy = parse(&annotations(&[
        (COMPUTE_MODE, "elastic"),
        (PLACEMENT, " spread "),
        (MODEL_INCLUDE, "A100, H100"),
        (MODEL_EXCLUDE, "MIG"),
        (UUID_INCLUDE, &format!("{A100},{H100}")),
        (UUID_EXCLUDE, "GPU-ffffffff-ffff-ffff-ffff-ffffffffffff"),
        (NUMA_BIND, "true"),
    ]))
    .unwrap();
    assert!(policy.numa_bind);
    assert_eq!(policy.compute_mode, Some(ComputeMode::Elastic));
    assert_eq!(policy.placement, Placement::Spread);
    assert_eq!(policy.models.include, ["A100", "H100"]);
    assert_eq!(policy.uuids.include.len(), 2);
    let hard = parse(&annotations(&[(COMPUTE_MODE, "hard")])).unwrap();
    assert_eq!(hard.compute_mode, Some(ComputeMode::Hard));
    let pack = parse(&annotations(&[
        (PLACEMENT, "binpack"),
        (NUMA_BIND, "false"),
    ]))
    .unwrap();
    assert_eq!(pack.placement, Placement::Binpack);
    assert!(!pack.numa_bind);
}

#[test]
fn bad_choices_name_key_value_and_choices() {
    assert_eq!(
        errors(&[(COMPUTE_MODE, "soft")]),
        ["annotation tessera.dev/compute-mode is \"soft\"; accepted: hard or elastic"]
    );
    assert_eq!(
        errors(&[(PLACEMENT, "Binpack")]),
        [
            "annotation tessera.dev/placement is \"Binpack\"; accepted: fragmentation, binpack or spread"
        ]
    );
    assert_eq!(
        errors(&[(NUMA_BIND, "yes")]),
        ["annotation tessera.dev/numa-bind is \"yes\"; accepted: true or false"]
    );
}

#[test]
fn unknown_tessera_keys_are_refused_with_the_known_list() {
    let found = errors(&[("tessera.dev/compute-mod", "hard"), ("other.io/x", "y")]);
    assert_eq!(found.len(), 1);
    assert!(found[0].starts_with(
        "annotation tessera.dev/compute-mod is not known; accepted: tessera.dev/compute-mode,"
    ));
    for key in KNOWN {
        assert!(found[0].contains(key), "{key} missing from the known list");
    }
}

#[test]
fn uuids_must_be_well_formed() {
    let found = errors(&[(UUID_INCLUDE, &format!("{A100},GPU-12,0"))]);
    assert_eq!(found.len(), 2);
    assert_eq!(
        found[0],
        "annotation tessera.dev/gpu-uuid-include lists \"GPU-12\", not a GPU UUID; accepted: comma-separated GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx (hex)"
    );
    assert!(found[1].contains("lists \"0\""));
    let found = errors(&[(UUID_EXCLUDE, "GPU-5e1a000g-0000-4000-8000-000051510000")]);
    assert_eq!(found.len(), 1);
}

#[test]
fn empty_lists_are_refused() {
    assert_eq!(
        errors(&[(MODEL_INCLUDE, " , ")]),
        [
            "annotation tessera.dev/gpu-model-include lists nothing; accepted: comma-separated model names, e.g. A100,H100"
        ]
    );
}

#[test]
fn include_and_exclude_of_the_same_item_conflict() {
    assert_eq!(
        errors(&[(MODEL_INCLUDE, "A100"), (MODEL_EXCLUDE, "a100")]),
        [
            "annotations tessera.dev/gpu-model-include and tessera.dev/gpu-model-exclude both list \"A100\"; accepted: an item in at most one of them"
        ]
    );
}

#[test]
fn all_errors_are_reported_together() {
    let found = errors(&[(COMPUTE_MODE, "x"), (PLACEMENT, "y"), ("tessera.dev/z", "")]);
    assert_eq!(found.len(), 3);
}

#[test]
fn selectors_filter_gpus() {
    let policy = parse(&annotations(&[
        (MODEL_INCLUDE, "a100"),
        (MODEL_EXCLUDE, "40GB"),
        (UUID_EXCLUDE, &H100.to_ascii_lowercase()),
    ]))
    .unwrap();
    assert!(policy.admits(A100, "NVIDIA A100-SXM4-80GB"));
    assert!(!policy.admits(A100, "NVIDIA A100-PCIE-40GB"));
    assert!(!policy.admits(A100, "NVIDIA H100 80GB HBM3"));
    assert!(!policy.admits(H100, "NVIDIA A100-SXM4-80GB"));
    let only = parse(&annotations(&[(UUID_INCLUDE, A100)])).unwrap();
    assert!(only.admits(A100, "any"));
    assert!(!only.admits(H100, "any"));
}

#[test]
fn uuid_prefix_and_hex_are_read_in_any_case() {
    for item in [
        A100.to_owned(),
        A100.to_ascii_lowercase(),
        A100.to_ascii_uppercase(),
        A100.replacen("GPU-", "Gpu-", 1),
    ] {
        assert!(
            parse(&annotations(&[(UUID_INCLUDE, &item)])).is_ok(),
            "{item} refused"
        );
    }
    let found = errors(&[(UUID_INCLUDE, "MIG-5e1a0000-0000-4000-8000-000051510000")]);
    assert_eq!(found.len(), 1);
}
