//! The scripted fake API server of the device plugin tests: the
//! workspace's one ([`tessera_testkit::apiserver::Pods`], a `tower-test`
//! mock service behind a real `kube::Client`), which answers the calls the
//! agent makes (list pods with a `spec.nodeName` field selector, get a
//! pod, JSON merge patch of a pod) as the API server does, including
//! `resourceVersion` preconditions (409 Conflict), and fails any other
//! request loudly.
//!
//! Pod fixtures are files under `tests/fixtures/pods/` shaped like
//! `kubectl get pod -o json` (without `managedFields`), with `{{KEY}}`
//! placeholders filled by [`fixture`].

use serde_json::Value;

pub use tessera_testkit::apiserver::Pods as FakeApi;

/// A fixture file with `{{KEY}}` replaced by each value, parsed.
pub fn fixture(name: &str, vars: &[(&str, &str)]) -> Value {
    let path = format!("{}/tests/fixtures/pods/{name}", env!("CARGO_MANIFEST_DIR"));
    let mut text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    for (k, v) in vars {
        text = text.replace(&format!("{{{{{k}}}}}"), v);
    }
    assert!(
        !text.contains("{{"),
        "{path}: a placeholder is left: {text}"
    );
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}
