//! `tessera-scheduler serve`: HTTP/1.1 routes in front of the pure
//! functions. [`route`] does the work and is tested without a socket;
//! [`serve`] only moves bytes.
//!
//! | route | body | answer |
//! |---|---|---|
//! | `POST /filter` | ExtenderArgs | ExtenderFilterResult; an unreadable body also answers 200 with `Error` set, so the scheduler reports it |
//! | `POST /prioritize` | ExtenderArgs | HostPriorityList; 400 for an unreadable body |
//! | `POST /bind` | ExtenderBindingArgs | ExtenderBindingResult with `Error`: binding is planned |
//! | `POST /webhook` | AdmissionReview | AdmissionReview (plain HTTP; the API server needs TLS, planned) |
//! | `GET /healthz` | – | `ok` |

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt as _, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode, header};
use hyper_util::rt::TokioIo;
use serde::Serialize;
use thiserror::Error;
use tokio::net::TcpListener;

use crate::extender::{
    self, ClusterView, ExtenderArgs, ExtenderBindingResult, ExtenderFilterResult,
};
use crate::webhook::{self, AdmissionReview, WebhookConfig};

/// Largest request body read (a full NodeList can be large).
pub const MAX_BODY: usize = 32 << 20;

/// What the routes answer from.
#[derive(Debug, Clone, Default)]
pub struct AppState {
    /// GPU telemetry the extender judges against.
    pub view: ClusterView,
    /// Webhook settings.
    pub webhook: WebhookConfig,
}

/// Failures of the server itself (never of a request).
#[derive(Debug, Error)]
pub enum ServerError {
    /// The listener failed for good.
    #[error("accepting connections failed")]
    Accept(#[source] std::io::Error),
}

/// An HTTP answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// Status code.
    pub status: StatusCode,
    /// `application/json` or `text/plain`.
    pub content_type: &'static str,
    /// Body.
    pub body: Vec<u8>,
}

impl Reply {
    fn json(value: &impl Serialize) -> Self {
        match serde_json::to_vec(value) {
            Ok(body) => Self {
                status: StatusCode::OK,
                content_type: "application/json",
                body,
            },
            Err(error) => Self::text(
                StatusCode::INTERNAL_SERVER_ERROR,
                &format!("encoding the answer failed: {error}"),
            ),
        }
    }

    fn text(status: StatusCode, text: &str) -> Self {
        Self {
            status,
            content_type: "text/plain; charset=utf-8",
            body: format!("{text}\n").into_bytes(),
        }
    }
}

/// Answers one request.
pub fn route(method: &str, path: &str, body: &[u8], state: &AppState) -> Reply {
    match (method, path) {
        ("GET", "/healthz") => Reply::text(StatusCode::OK, "ok"),
        ("POST", "/filter") => Reply::json(&match serde_json::from_slice::<ExtenderArgs>(body) {
            Ok(args) => extender::filter(&args, &state.view),
            Err(error) => ExtenderFilterResult {
                error: format!("request body is not ExtenderArgs JSON: {error}"),
                ..ExtenderFilterResult::default()
            },
        }),
        ("POST", "/prioritize") => match serde_json::from_slice::<ExtenderArgs>(body) {
            Ok(args) => Reply::json(&extender::prioritize(&args, &state.view)),
            Err(error) => bad_request("ExtenderArgs", &error),
        },
        ("POST", "/bind") => Reply::json(&ExtenderBindingResult {
            error: "the tessera extender does not bind yet (planned); remove bindVerb from the scheduler configuration".to_owned(),
        }),
        ("POST", "/webhook") => match serde_json::from_slice::<AdmissionReview>(body) {
            Ok(review) => match webhook::review(&review, &state.webhook) {
                Ok(answer) => Reply::json(&answer),
                Err(error) => Reply::text(StatusCode::BAD_REQUEST, &error.full_message()),
            },
            Err(error) => bad_request("AdmissionReview", &error),
        },
        (_, "/healthz" | "/filter" | "/prioritize" | "/bind" | "/webhook") => {
            Reply::text(StatusCode::METHOD_NOT_ALLOWED, &format!("{method} is not accepted on {path}"))
        }
        _ => Reply::text(StatusCode::NOT_FOUND, &format!("no route {path}")),
    }
}

fn bad_request(what: &str, error: &serde_json::Error) -> Reply {
    Reply::text(
        StatusCode::BAD_REQUEST,
        &format!("request body is not {what} JSON: {error}"),
    )
}

async fn handle(
    request: Request<Incoming>,
    state: Arc<AppState>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (parts, body) = request.into_parts();
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    let too_large = |detail: &str| {
        Reply::text(
            StatusCode::PAYLOAD_TOO_LARGE,
            &format!("request body is over the limit of {MAX_BODY} bytes{detail}"),
        )
    };
    // Refuse before reading: a body that never comes must not hold the task.
    let reply = if declared.is_some_and(|n| n > MAX_BODY as u64) {
        too_large("")
    } else {
        match Limited::new(body, MAX_BODY).collect().await {
            Ok(collected) => route(
                parts.method.as_str(),
                parts.uri.path(),
                &collected.to_bytes(),
                &state,
            ),
            Err(error) => too_large(&format!(" or unreadable: {error}")),
        }
    };
    let mut response = Response::new(Full::new(Bytes::from(reply.body)));
    *response.status_mut() = reply.status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(reply.content_type),
    );
    Ok(response)
}

/// Serves connections from `listener` until `shutdown` completes.
///
/// # Errors
/// [`ServerError::Accept`] when the listener fails with something other
/// than a passing condition (those are retried after a pause).
pub async fn serve(
    listener: TcpListener,
    state: Arc<AppState>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServerError> {
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            () = &mut shutdown => return Ok(()),
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(error) if is_transient(&error) => {
                tracing::warn!(%error, "accept failed; retrying");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            Err(error) => return Err(ServerError::Accept(error)),
        };
        let state = state.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request| handle(request, state.clone()));
            if let Err(error) = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(%error, "connection ended with an error");
            }
        });
    }
}

/// Accept errors that pass: aborted connections and descriptor exhaustion.
fn is_transient(error: &std::io::Error) -> bool {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionReset, Interrupted, WouldBlock};
    matches!(
        error.kind(),
        ConnectionAborted | ConnectionReset | Interrupted | WouldBlock
    ) || matches!(error.raw_os_error(), Some(23 | 24)) // ENFILE, EMFILE
}

#[cfg(test)]
mod tests;
