//! The ResourceClaimTemplates the webhook's DRA mode names in the pods it
//! admits ([`crate::webhook::dra`]), made through the API server before
//! the pod is admitted, so that no pod is stored naming a template that
//! is not there.
//!
//! For each template, in the pod's namespace: read it; absent, create it
//! (another webhook call may create it first: AlreadyExists reads it
//! again); present, its `spec` must be the one the webhook would write
//! ([`same_spec`]), else the pod is refused: a template of that name made
//! or replaced by someone else (the spec is immutable) would give the
//! pod something other than its resources say. Any other API error
//! refuses the pod too, naming the template and its namespace. On a dry
//! run ([`ClaimTemplates::ensure`] with `dry_run`) templates are read and
//! compared but never made (the webhook configuration says
//! `sideEffects: NoneOnDryRun`). All of it must finish within
//! [`TIMEOUT`], under the webhook's own timeout (5 s in the chart).
//!
//! Templates are content-named and shared by every pod asking the same,
//! so they are never deleted here; they are small and hold nothing.
//! RBAC: `get` and `create` on `resource.k8s.io` `resourceclaimtemplates`.

use std::time::Duration;

use k8s_openapi::api::resource::v1::{ResourceClaimTemplate, ResourceClaimTemplateSpec};
use kube::api::{Api, PostParams};
use serde_json::Value;
use tessera_api::quantity::parse_whole;
use thiserror::Error;

/// How long making one pod's templates may take.
pub const TIMEOUT: Duration = Duration::from_secs(3);

/// Why a pod's templates are not all there; each names the template and
/// its namespace.
#[derive(Debug, Error)]
pub enum TemplateError {
    /// The template names no namespace (the pod had none).
    #[error("resourceclaimtemplate {name} has no namespace to be made in")]
    NoNamespace {
        /// The template's name.
        name: String,
    },
    /// Reading the template failed.
    #[error("resourceclaimtemplate {namespace}/{name} could not be read")]
    Read {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
    /// Creating the template failed.
    #[error("resourceclaimtemplate {namespace}/{name} could not be created")]
    Create {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
    /// A template of that name exists with another spec.
    #[error(
        "resourceclaimtemplate {namespace}/{name} exists with a spec other than the one the webhook writes for this request (made or replaced by someone else), so the pod would get something other than its resources say; accepted: delete that template (the webhook makes it again) or give the pod other GPU resources"
    )]
    Mismatch {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
    },
    /// The API server did not answer in time.
    #[error("resourceclaimtemplates {names} were not all made within {timeout:?}")]
    Timeout {
        /// `namespace/name` of each, comma-separated.
        names: String,
        /// The limit.
        timeout: Duration,
    },
    /// No API client to make them with.
    #[error(
        "resourceclaimtemplates {names} cannot be made: this server has no API client for them (serve --dra makes one)"
    )]
    NoClient {
        /// `namespace/name` of each, comma-separated.
        names: String,
    },
}

impl TemplateError {
    /// HTTP-style status code for the AdmissionResponse: 409 for a
    /// template that differs, 500 for the rest (the webhook's own
    /// failure, not the pod's).
    pub fn code(&self) -> u16 {
        match self {
            TemplateError::Mismatch { .. } => 409,
            _ => 500,
        }
    }

    /// The message with its causes, for a person to read.
    pub fn full_message(&self) -> String {
        crate::error_chain::with_causes(self)
    }

    /// The error for `templates` when no client is configured.
    pub fn no_client(templates: &[ResourceClaimTemplate]) -> Self {
        TemplateError::NoClient {
            names: names(templates),
        }
    }
}

/// `namespace/name` of each template, comma-separated.
fn names(templates: &[ResourceClaimTemplate]) -> String {
    templates
        .iter()
        .map(|t| {
            format!(
                "{}/{}",
                t.metadata.namespace.as_deref().unwrap_or_default(),
                t.metadata.name.as_deref().unwrap_or_default()
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Makes the templates the webhook names, through the API server.
#[derive(Clone)]
pub struct ClaimTemplates {
    client: kube::Client,
    timeout: Duration,
}

impl std::fmt::Debug for ClaimTemplates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClaimTemplates")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl ClaimTemplates {
    /// Templates made with `client`, within [`TIMEOUT`].
    pub fn new(client: kube::Client) -> Self {
        Self {
            client,
            timeout: TIMEOUT,
        }
    }

    /// The same, within `timeout`.
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Makes sure each of `templates` exists with its spec (see the module
    /// documentation); on a dry run only reads and compares.
    ///
    /// # Errors
    /// The first template that is not there as written, and why.
    pub async fn ensure(
        &self,
        templates: &[ResourceClaimTemplate],
        dry_run: bool,
    ) -> Result<(), TemplateError> {
        let all = async {
            for template in templates {
                self.ensure_one(template, dry_run).await?;
            }
            Ok(())
        };
        tokio::time::timeout(self.timeout, all)
            .await
            .unwrap_or_else(|_| {
                Err(TemplateError::Timeout {
                    names: names(templates),
                    timeout: self.timeout,
                })
            })
    }

    async fn ensure_one(
        &self,
        template: &ResourceClaimTemplate,
        dry_run: bool,
    ) -> Result<(), TemplateError> {
        let name = template.metadata.name.clone().unwrap_or_default();
        let Some(namespace) = template.metadata.namespace.clone() else {
            return Err(TemplateError::NoNamespace { name });
        };
        let api = Api::<ResourceClaimTemplate>::namespaced(self.client.clone(), &namespace);
        let read = |source| TemplateError::Read {
            namespace: namespace.clone(),
            name: name.clone(),
            source,
        };
        let compare = |found: &ResourceClaimTemplate| {
            if same_spec(template, found) {
                Ok(())
            } else {
                Err(TemplateError::Mismatch {
                    namespace: namespace.clone(),
                    name: name.clone(),
                })
            }
        };
        if let Some(found) = api.get_opt(&name).await.map_err(read)? {
            return compare(&found);
        }
        if dry_run {
            return Ok(());
        }
        match api.create(&PostParams::default(), template).await {
            Ok(_) => {
                tracing::info!(%namespace, %name, "resourceclaimtemplate created");
                Ok(())
            }
            // Made meanwhile by another call: it must be the same.
            Err(kube::Error::Api(status)) if status.is_already_exists() => {
                let found = api.get(&name).await.map_err(read)?;
                compare(&found)
            }
            Err(source) => Err(TemplateError::Create {
                namespace: namespace.clone(),
                name: name.clone(),
                source,
            }),
        }
    }
}

/// Whether `found` (as the API server returns it) has the spec of `ours`:
/// equal once the API server's own changes are undone on both sides:
/// fields it defaults (`allocationMode: ExactCount`, `count: 1`), empty or
/// false fields it may drop or add, and capacity quantities in any
/// spelling of the same number (it stores `4096Mi` as `4Gi`). Metadata is
/// not compared (labels may be edited; the name is the same).
pub fn same_spec(ours: &ResourceClaimTemplate, found: &ResourceClaimTemplate) -> bool {
    normalised(ours.spec.as_ref()) == normalised(found.spec.as_ref())
}

fn normalised(spec: Option<&ResourceClaimTemplateSpec>) -> Value {
    let mut value = serde_json::to_value(spec).unwrap_or(Value::Null);
    normalise(&mut value, None);
    value
}

/// Drops nulls, `false`, empty maps and lists; fills request defaults;
/// writes capacity quantities as plain numbers.
fn normalise(value: &mut Value, key: Option<&str>) {
    match value {
        Value::Object(map) => {
            let is_request = map.contains_key("deviceClassName");
            for (k, v) in map.iter_mut() {
                normalise(v, Some(k));
            }
            if key == Some("requests") && map.values().all(Value::is_string) {
                // A capacity's requests: quantities.
                for v in map.values_mut() {
                    if let Some(n) = v.as_str().and_then(|q| parse_whole(q).ok()) {
                        *v = Value::from(n.to_string());
                    }
                }
            }
            if is_request {
                let mode = map
                    .entry("allocationMode")
                    .or_insert_with(|| Value::from("ExactCount"));
                if mode == "ExactCount" {
                    map.entry("count").or_insert_with(|| Value::from(1));
                }
            }
            map.retain(|_, v| !is_empty(v));
        }
        Value::Array(items) => {
            for item in items.iter_mut() {
                normalise(item, None);
            }
        }
        _ => {}
    }
}

fn is_empty(value: &Value) -> bool {
    match value {
        Value::Null | Value::Bool(false) => true,
        Value::Object(map) => map.is_empty(),
        Value::Array(items) => items.is_empty(),
        _ => false,
    }
}

#[cfg(test)]
mod tests;
