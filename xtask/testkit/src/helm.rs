//! The Helm chart (`deploy/helm/tessera`) rendered, linted and packaged
//! with the Helm Go SDK through its Python binding, and its objects
//! checked against the Kubernetes JSON schemas with kubernetes-validate:
//! both reached only through `xtask/testkit/helm_check.py`, both installed
//! by `cargo xtask setup` (the chart tests of the scheduler and of the
//! agent use this module).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;

use crate::sim::workspace;

/// Why a chart test cannot run here (print it as `skipped: <why>`).
pub const NO_HELM: &str = "helm not installed (pip install helm-python-sdk==0.2.2)";

/// Why a schema check cannot run here (print it as `skipped: <why>`).
pub const NO_VALIDATE: &str =
    "kubernetes-validate not installed (pip install kubernetes-validate==1.34.1)";

/// The chart's folder.
pub fn chart() -> PathBuf {
    workspace().join("deploy/helm/tessera")
}

/// The bridge to Helm; it exits 3 when the SDK is not installed.
fn helm_check(args: &[std::ffi::OsString]) -> Result<Output, String> {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("helm_check.py");
    let output = Command::new("python3")
        .arg(&script)
        .args(args)
        .output()
        .map_err(|e| format!("{NO_HELM}: cannot run python3 {}: {e}", script.display()))?;
    if output.status.code() == Some(3) {
        return Err(NO_HELM.to_owned());
    }
    Ok(output)
}

/// The chart rendered with `values` (a values file as JSON): `Err(why)`
/// when the Helm SDK is missing; `Ok(Err(stderr))` when Helm refuses the
/// values (or the chart); `Ok(Ok(report))` with the report
/// `helm_check.py` prints: `lint`, `manifests`, `crds`, `objects` (every
/// rendered object as JSON) and `validation` (null without
/// kubernetes-validate).
pub fn render(values: &Value) -> Result<Result<Value, String>, String> {
    let output = helm_check(&[chart().into(), values.to_string().into()])?;
    if !output.status.success() {
        return Ok(Err(String::from_utf8_lossy(&output.stderr).into_owned()));
    }
    Ok(Ok(serde_json::from_slice(&output.stdout).unwrap_or_else(
        |e| panic!("helm_check.py printed no report for {values}: {e}"),
    )))
}

/// The chart's files as `helm package` archives them (path in the archive,
/// the chart's name first → text); `Err(why)` when the Helm SDK is
/// missing.
pub fn package() -> Result<BTreeMap<String, String>, String> {
    let output = helm_check(&["--package".into(), chart().into()])?;
    assert!(
        output.status.success(),
        "packaging the chart failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    Ok(serde_json::from_value(report["files"].clone()).unwrap())
}
