//! The subset of the Kubernetes `v1.Pod` that Tessera reads.
//!
//! Field names follow the Kubernetes JSON (camelCase); unknown fields are
//! ignored, so a full Pod from the API server deserialises into this. The
//! webhook never re-serialises these types: it patches the original JSON, so
//! nothing outside this subset can be lost.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A Pod, reduced to what scheduling GPU shares needs.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Pod {
    /// Standard object metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// The pod's spec.
    #[serde(default)]
    pub spec: PodSpec,
}

impl Pod {
    /// Reads a pod from Kubernetes JSON, borrowing it (no copy of the
    /// object is made).
    ///
    /// # Errors
    /// The JSON is not a pod this crate can read.
    pub fn from_json(object: &serde_json::Value) -> Result<Self, serde_json::Error> {
        Self::deserialize(object)
    }
}

/// The parts of `ObjectMeta` Tessera uses.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectMeta {
    /// Object name; empty for a pod created with `generateName` before admission.
    #[serde(default)]
    pub name: String,
    /// Prefix the API server completes into a name.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub generate_name: String,
    /// Namespace.
    #[serde(default)]
    pub namespace: String,
    /// UID, set by the API server.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uid: String,
    /// Labels.
    #[serde(default, deserialize_with = "null_as_default")]
    pub labels: BTreeMap<String, String>,
    /// Annotations; Tessera's policy keys live under `tessera.dev/`.
    #[serde(default, deserialize_with = "null_as_default")]
    pub annotations: BTreeMap<String, String>,
}

impl ObjectMeta {
    /// The name to show a person: the name, else `generateName` + `*`.
    pub fn display_name(&self) -> String {
        if self.name.is_empty() && !self.generate_name.is_empty() {
            format!("{}*", self.generate_name)
        } else {
            self.name.clone()
        }
    }
}

/// The parts of `PodSpec` Tessera uses.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSpec {
    /// Scheduler that places the pod; empty means the default scheduler.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub scheduler_name: String,
    /// Set when the pod names its node itself, bypassing every scheduler.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub node_name: String,
    /// Application containers.
    #[serde(default, deserialize_with = "null_as_default")]
    pub containers: Vec<Container>,
    /// Init containers (including restartable sidecars).
    #[serde(default, deserialize_with = "null_as_default")]
    pub init_containers: Vec<Container>,
}

/// The parts of a `Container` Tessera uses.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Container {
    /// Container name, unique within the pod.
    #[serde(default)]
    pub name: String,
    /// Requests and limits.
    #[serde(default)]
    pub resources: ResourceRequirements,
    /// Security context; only `privileged` matters here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security_context: Option<SecurityContext>,
}

impl Container {
    /// Whether the container runs privileged (full device access, which
    /// no GPU share can contain).
    pub fn is_privileged(&self) -> bool {
        self.security_context
            .as_ref()
            .and_then(|sc| sc.privileged)
            .unwrap_or(false)
    }
}

/// `ResourceRequirements`: resource name → quantity.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
pub struct ResourceRequirements {
    /// Limits.
    #[serde(default, deserialize_with = "null_as_default")]
    pub limits: BTreeMap<String, Quantity>,
    /// Requests.
    #[serde(default, deserialize_with = "null_as_default")]
    pub requests: BTreeMap<String, Quantity>,
}

/// The parts of a container `SecurityContext` Tessera uses.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
pub struct SecurityContext {
    /// `privileged: true`.
    #[serde(default)]
    pub privileged: Option<bool>,
}

/// A quantity as written: the API server sends strings (`"4k"`), while a
/// YAML manifest may hold a bare number (`4000`). Both are kept as text and
/// parsed by [`tessera_api::quantity::parse_whole`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quantity(pub String);

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Serialize for Quantity {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Quantity {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct QuantityVisitor;
        impl Visitor<'_> for QuantityVisitor {
            type Value = Quantity;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a quantity string or number")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Quantity, E> {
                Ok(Quantity(v.to_owned()))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Quantity, E> {
                Ok(Quantity(v.to_string()))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Quantity, E> {
                Ok(Quantity(v.to_string()))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Quantity, E> {
                Ok(Quantity(v.to_string()))
            }
        }
        deserializer.deserialize_any(QuantityVisitor)
    }
}

/// Kubernetes JSON writes absent maps and lists as `null` as often as it
/// omits them; treat both the same.
fn null_as_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_a_full_api_server_pod_and_ignores_the_rest() {
        let pod: Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "ml", "uid": "u-1",
                          "annotations": null, "labels": {"app": "x"}},
            "spec": {"containers": [{"name": "c", "image": "i",
                "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4k"}},
                "securityContext": {"privileged": true}}],
                "initContainers": null, "restartPolicy": "Never"},
            "status": {"phase": "Pending"}
        }))
        .unwrap();
        assert_eq!(pod.metadata.namespace, "ml");
        assert!(pod.metadata.annotations.is_empty());
        assert_eq!(
            pod.spec.containers[0].resources.limits["nvidia.com/gpumem"].0,
            "4k"
        );
        assert!(pod.spec.containers[0].is_privileged());
        assert!(pod.spec.init_containers.is_empty());
    }

    #[test]
    fn quantities_may_be_bare_numbers_in_yaml() {
        let pod: Pod = serde_norway::from_str(
            "spec:\n  containers:\n  - name: c\n    resources:\n      limits:\n        nvidia.com/gpu: 2\n        nvidia.com/gpumem: 4000\n",
        )
        .unwrap();
        let limits = &pod.spec.containers[0].resources.limits;
        assert_eq!(limits["nvidia.com/gpu"], Quantity("2".into()));
        assert_eq!(limits["nvidia.com/gpumem"], Quantity("4000".into()));
    }

    #[test]
    fn display_name_falls_back_to_generate_name() {
        let meta = ObjectMeta {
            generate_name: "job-".into(),
            ..ObjectMeta::default()
        };
        assert_eq!(meta.display_name(), "job-*");
    }
}
