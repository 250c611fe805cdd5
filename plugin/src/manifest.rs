//! Pods in manifest files, for `tessera-scheduler check-pod`.
//!
//! A file holds one or more YAML documents (JSON is YAML too). Each
//! document is a Pod or a workload with a pod template (Deployment,
//! StatefulSet, DaemonSet, ReplicaSet, Job: `spec.template`; CronJob:
//! `spec.jobTemplate.spec.template`); the template is checked as the pod it
//! will become, so patch paths are relative to that pod.

use serde::Deserialize;
use serde_json::{Map, Value};
use thiserror::Error;

const ACCEPTED_KINDS: &str = "Pod, Deployment, StatefulSet, DaemonSet, ReplicaSet, Job, CronJob";

/// Why a manifest could not be read.
#[derive(Debug, Error)]
pub enum ManifestError {
    /// Not YAML (or JSON).
    #[error("manifest is not valid YAML or JSON")]
    Syntax(#[source] serde_norway::Error),
    /// A document of a kind without a pod.
    #[error("document {index} is a {kind:?}, which holds no pod; accepted kinds: {ACCEPTED_KINDS}")]
    Kind {
        /// 1-based document number.
        index: usize,
        /// Its `kind`.
        kind: String,
    },
    /// A workload whose template is missing.
    #[error("document {index} ({kind}) has no pod template at {path}")]
    NoTemplate {
        /// 1-based document number.
        index: usize,
        /// Its `kind`.
        kind: String,
        /// Where the template should be.
        path: &'static str,
    },
    /// No document at all.
    #[error("manifest holds no document")]
    Empty,
}

/// One pod found in a manifest.
#[derive(Debug, Clone, PartialEq)]
pub struct FoundPod {
    /// What it came from, e.g. `Deployment ml/train (pod template)`.
    pub source: String,
    /// The pod as JSON.
    pub pod: Value,
}

/// Every pod in `text`.
///
/// # Errors
/// A [`ManifestError`] for unreadable text or a document without a pod.
pub fn pods_in(text: &str) -> Result<Vec<FoundPod>, ManifestError> {
    let mut found = Vec::new();
    for (i, document) in serde_norway::Deserializer::from_str(text).enumerate() {
        let doc = Value::deserialize(document).map_err(ManifestError::Syntax)?;
        if doc.is_null() {
            continue;
        }
        found.push(pod_of(i + 1, &doc)?);
    }
    if found.is_empty() {
        return Err(ManifestError::Empty);
    }
    Ok(found)
}

fn pod_of(index: usize, doc: &Value) -> Result<FoundPod, ManifestError> {
    let text = |pointer: &str| doc.pointer(pointer).and_then(Value::as_str).unwrap_or("");
    let kind = text("/kind").to_owned();
    let namespace = text("/metadata/namespace");
    let name = text("/metadata/name");
    let label = if namespace.is_empty() {
        format!("{kind} {name}")
    } else {
        format!("{kind} {namespace}/{name}")
    };
    let path = match kind.as_str() {
        "Pod" => {
            return Ok(FoundPod {
                source: label,
                pod: doc.clone(),
            });
        }
        "Deployment" | "StatefulSet" | "DaemonSet" | "ReplicaSet" | "Job" => "/spec/template",
        "CronJob" => "/spec/jobTemplate/spec/template",
        _ => return Err(ManifestError::Kind { index, kind }),
    };
    let template = doc
        .pointer(path)
        .and_then(Value::as_object)
        .ok_or_else(|| ManifestError::NoTemplate {
            index,
            kind: kind.clone(),
            path,
        })?;
    let mut metadata = template
        .get("metadata")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    if !namespace.is_empty() {
        metadata
            .entry("namespace")
            .or_insert_with(|| Value::from(namespace));
    }
    let mut pod = Map::new();
    pod.insert("apiVersion".into(), Value::from("v1"));
    pod.insert("kind".into(), Value::from("Pod"));
    pod.insert("metadata".into(), Value::Object(metadata));
    pod.insert(
        "spec".into(),
        template.get("spec").cloned().unwrap_or(Value::Null),
    );
    Ok(FoundPod {
        source: format!("{label} (pod template)"),
        pod: Value::Object(pod),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_pods_and_templates_from_several_documents() {
        let text = "apiVersion: v1\nkind: Pod\nmetadata: {name: a, namespace: ml}\nspec: {containers: []}\n---\n\
                    kind: Deployment\nmetadata: {name: d, namespace: ml}\nspec:\n  template:\n    metadata: {labels: {app: d}}\n    spec:\n      containers: [{name: c}]\n---\n\
                    kind: CronJob\nmetadata: {name: j}\nspec: {jobTemplate: {spec: {template: {spec: {containers: []}}}}}\n---\n";
        let found = pods_in(text).unwrap();
        let sources: Vec<&str> = found.iter().map(|f| f.source.as_str()).collect();
        assert_eq!(
            sources,
            [
                "Pod ml/a",
                "Deployment ml/d (pod template)",
                "CronJob j (pod template)"
            ]
        );
        assert_eq!(found[1].pod["metadata"]["namespace"], "ml");
        assert_eq!(found[1].pod["metadata"]["labels"]["app"], "d");
        assert_eq!(found[1].pod["spec"]["containers"][0]["name"], "c");
    }

    #[test]
    fn json_is_read_too() {
        let found = pods_in(r#"{"kind": "Pod", "metadata": {"name": "p"}, "spec": {}}"#).unwrap();
        assert_eq!(found[0].source, "Pod p");
    }

    #[test]
    fn refusals_name_the_document() {
        let err = pods_in("kind: Service\nmetadata: {name: s}\n").unwrap_err();
        assert_eq!(
            err.to_string(),
            "document 1 is a \"Service\", which holds no pod; accepted kinds: Pod, Deployment, StatefulSet, DaemonSet, ReplicaSet, Job, CronJob"
        );
        let err = pods_in("kind: Pod\n---\nkind: Job\nspec: {}\n").unwrap_err();
        assert_eq!(
            err.to_string(),
            "document 2 (Job) has no pod template at /spec/template"
        );
        assert!(matches!(pods_in("---\n"), Err(ManifestError::Empty)));
        assert!(matches!(
            pods_in("kind: [unclosed"),
            Err(ManifestError::Syntax(_))
        ));
    }
}
