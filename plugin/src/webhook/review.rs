//! `admission.k8s.io/v1` AdmissionReview wire types and the review step.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{WebhookConfig, WebhookError, admit_pod};

/// The envelope the API server sends and expects back.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionReview {
    /// `admission.k8s.io/v1`.
    #[serde(default)]
    pub api_version: String,
    /// `AdmissionReview`.
    #[serde(default)]
    pub kind: String,
    /// Set in what the API server sends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<AdmissionRequest>,
    /// Set in the answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response: Option<AdmissionResponse>,
}

/// `group`/`version`/`kind` of the object under review.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
pub struct GroupVersionKind {
    /// API group; empty for core.
    #[serde(default)]
    pub group: String,
    /// Version.
    #[serde(default)]
    pub version: String,
    /// Kind.
    #[serde(default)]
    pub kind: String,
}

/// The parts of an AdmissionRequest the webhook reads.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionRequest {
    /// Echoed in the response.
    pub uid: String,
    /// Kind of the object.
    #[serde(default)]
    pub kind: GroupVersionKind,
    /// Subresource, e.g. `ephemeralcontainers`; empty for the object itself.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub sub_resource: String,
    /// Object name; may be empty on CREATE with generateName.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// Namespace of the object.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// CREATE, UPDATE, DELETE or CONNECT.
    #[serde(default)]
    pub operation: String,
    /// The object as it would be stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object: Option<Value>,
    /// Whether this is a dry run: nothing may be made (DRA mode makes
    /// ResourceClaimTemplates otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dry_run: Option<bool>,
}

/// `metav1.Status`, the parts a refusal needs.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
pub struct Status {
    /// HTTP-style code.
    pub code: u16,
    /// `Failure`.
    pub status: String,
    /// Text kubectl shows after "denied the request:".
    pub message: String,
}

/// The webhook's answer.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionResponse {
    /// The request's uid.
    pub uid: String,
    /// Whether the object is admitted.
    pub allowed: bool,
    /// Why not, when refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<Status>,
    /// Base64 of a JSON patch array.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub patch: Option<String>,
    /// `JSONPatch` when `patch` is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub patch_type: Option<String>,
    /// Warnings kubectl prints.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

#[cfg(test)]
impl AdmissionResponse {
    /// The decoded patch (the tests read it back).
    pub fn patch_json(&self) -> Option<Value> {
        let bytes = STANDARD.decode(self.patch.as_deref()?).ok()?;
        serde_json::from_slice(&bytes).ok()
    }
}

/// A judged review: the answer, and what must exist before it is sent.
#[derive(Debug, Clone, PartialEq)]
pub struct Reviewed {
    /// The AdmissionReview to send back.
    pub answer: AdmissionReview,
    /// DRA mode: the ResourceClaimTemplates the admitted pod names, which
    /// must exist before the answer is sent ([`super::Admitted::templates`]);
    /// empty otherwise and for refusals.
    pub templates: Vec<ResourceClaimTemplate>,
    /// The request is a dry run: nothing may be made.
    pub dry_run: bool,
}

impl Reviewed {
    /// The answer turned into a refusal with `code` and `message` (no
    /// patch: nothing of the pod is admitted), for when the templates
    /// could not be made.
    pub fn refused(self, code: u16, message: String) -> AdmissionReview {
        let mut answer = self.answer;
        if let Some(response) = answer.response.as_mut() {
            refuse(response, code, message);
        }
        answer
    }
}

fn refuse(response: &mut AdmissionResponse, code: u16, message: String) {
    response.allowed = false;
    response.patch = None;
    response.patch_type = None;
    response.status = Some(Status {
        code,
        status: "Failure".to_owned(),
        message,
    });
}

/// Answers one AdmissionReview. Only Pod CREATE is judged; anything else
/// (the webhook may be registered more widely by mistake) is allowed as is.
/// A pod without a namespace of its own is judged in the request's (the
/// namespace its templates are made in).
///
/// # Errors
/// [`WebhookError::NoRequest`] when the review carries no request; every
/// judgement, refusals included, is an `Ok` response.
pub fn review(
    incoming: &AdmissionReview,
    config: &WebhookConfig,
) -> Result<Reviewed, WebhookError> {
    let request = incoming.request.as_ref().ok_or(WebhookError::NoRequest)?;
    let mut response = AdmissionResponse {
        uid: request.uid.clone(),
        allowed: true,
        ..AdmissionResponse::default()
    };
    let mut templates = Vec::new();
    let is_pod_create = request.kind.group.is_empty()
        && request.kind.kind == "Pod"
        && request.operation == "CREATE"
        && request.sub_resource.is_empty();
    if is_pod_create {
        let object = request.object.as_ref().unwrap_or(&Value::Null);
        let in_namespace = with_namespace(object, &request.namespace);
        match admit_pod(in_namespace.as_ref().unwrap_or(object), config) {
            Ok(admitted) => {
                if !admitted.patch.is_empty() {
                    let bytes = serde_json::to_vec(&admitted.patch).unwrap_or_default();
                    response.patch = Some(STANDARD.encode(bytes));
                    response.patch_type = Some("JSONPatch".to_owned());
                }
                response.warnings = admitted.warnings;
                templates = admitted.templates;
            }
            Err(error) => refuse(&mut response, error.code(), error.full_message()),
        }
    }
    let answer = AdmissionReview {
        api_version: if incoming.api_version.is_empty() {
            "admission.k8s.io/v1".to_owned()
        } else {
            incoming.api_version.clone()
        },
        kind: "AdmissionReview".to_owned(),
        request: None,
        response: Some(response),
    };
    Ok(Reviewed {
        answer,
        templates,
        dry_run: request.dry_run.unwrap_or(false),
    })
}

/// `object` with `metadata.namespace` set to `namespace`, when it has none
/// and `namespace` is not empty.
fn with_namespace(object: &Value, namespace: &str) -> Option<Value> {
    let own = object
        .pointer("/metadata/namespace")
        .and_then(Value::as_str);
    if namespace.is_empty() || own.is_some_and(|n| !n.is_empty()) {
        return None;
    }
    let mut object = object.clone();
    object
        .get_mut("metadata")?
        .as_object_mut()?
        .insert("namespace".to_owned(), Value::from(namespace));
    Some(object)
}
