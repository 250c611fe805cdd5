//! `tessera-scheduler serve`: HTTP/1.1 routes in front of the pure
//! functions. [`route`] does the work and is tested without a socket;
//! [`serve`] only moves bytes.
//!
//! | route | body | answer |
//! |---|---|---|
//! | `POST /filter` | ExtenderArgs | ExtenderFilterResult; an unreadable body also answers 200 with `Error` set, so the scheduler reports it |
//! | `POST /prioritize` | ExtenderArgs | HostPriorityList; 400 for an unreadable body |
//! | `POST /bind` | ExtenderBindingArgs | ExtenderBindingResult ([`crate::bind`]); `Error` set when no API client is configured |
//! | `GET /metrics` | – | Prometheus text ([`crate::metrics`]); plain listener only |
//! | `POST /webhook` | AdmissionReview | AdmissionReview; in DRA mode the templates the pod names are made first ([`crate::claim_templates`]), and a failure refuses the pod |
//! | `GET /healthz` | – | `ok` |
//!
//! **Two listeners** ([`Routes`]): the plain one ([`serve`]) answers every
//! route and belongs on localhost, where kube-scheduler reaches it in the
//! same pod; the HTTPS one ([`serve_tls`], certificate from [`tls`])
//! answers only `/webhook` and `/healthz`, so the cluster network that
//! reaches the webhook never reaches the extender verbs.
//!
//! **What one connection may take** ([`Limits`]): the request's headers
//! must be complete within [`Limits::header_read_timeout`] of the
//! connection's start (or of the previous response, so an idle keep-alive
//! connection is closed after it too), the body within
//! [`Limits::body_read_timeout`] of the headers, and the body may be at
//! most [`Limits::max_body`] bytes. A client that sends its headers byte
//! by byte, or never finishes its body, is disconnected (the body case
//! with `408 Request Timeout`) instead of holding a task and a socket
//! for ever; a body over the limit answers `413`. Headers themselves are
//! bounded by hyper (about 400 KiB, 100 fields: `431` beyond). On the
//! HTTPS listener the TLS handshake must also finish within
//! [`Limits::header_read_timeout`] of the connection's start. At most
//! [`Limits::max_connections`] connections are served at once per
//! listener; further ones wait in the kernel's accept queue until one
//! ends, so a flood of connections cannot exhaust the process's file
//! descriptors or memory.

pub mod tls;

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt as _, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode, header};
use hyper_util::rt::{TokioIo, TokioTimer};
use serde::Serialize;
use thiserror::Error;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::bind::Binder;
use crate::claim_templates::{ClaimTemplates, TemplateError};
use crate::extender::{
    self, ClusterView, ExtenderArgs, ExtenderBindingArgs, ExtenderBindingResult,
    ExtenderFilterResult,
};
use crate::metrics::Metrics;
use crate::telemetry::{Cache, Snapshot, Staleness};
use crate::webhook::{self, AdmissionReview, WebhookConfig};

/// Default largest request body (a full NodeList can be large).
pub const MAX_BODY: usize = 32 << 20;

/// What one connection may take of the server; see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Until a request's headers are complete, from the connection's
    /// start or the previous response. Default 10 s: kube-scheduler sends
    /// each request whole, on localhost.
    pub header_read_timeout: Duration,
    /// Until a request's body is complete, from its headers. Default 10 s.
    pub body_read_timeout: Duration,
    /// Largest request body, in bytes. Default [`MAX_BODY`] (32 MiB).
    pub max_body: usize,
    /// Connections served at once per listener. Default
    /// [`MAX_CONNECTIONS`].
    pub max_connections: usize,
}

/// Default connections served at once per listener.
pub const MAX_CONNECTIONS: usize = 512;

impl Default for Limits {
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(10),
            max_body: MAX_BODY,
            max_connections: MAX_CONNECTIONS,
        }
    }
}

/// Where the GPU telemetry the routes judge against comes from: the one
/// home of "the current view" ([`AppState::current`] adds the
/// reservations).
#[derive(Clone)]
pub enum Telemetry {
    /// A fixed view (`--nodes FILE`, tests); nothing in it is stale.
    Static(Snapshot),
    /// The `GpuNode` reflector cache, sorted into fresh and stale at each
    /// request.
    Live {
        /// The cache.
        cache: Cache,
        /// How old a status may be.
        staleness: Staleness,
    },
}

impl Default for Telemetry {
    fn default() -> Self {
        Self::Static(Snapshot::default())
    }
}

impl From<ClusterView> for Telemetry {
    fn from(view: ClusterView) -> Self {
        Self::Static(Snapshot {
            view,
            ..Snapshot::default()
        })
    }
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Static(s) => f.debug_tuple("Static").field(&s.view.len()).finish(),
            Self::Live { staleness, .. } => f
                .debug_struct("Live")
                .field("max_age", &staleness.max_age())
                .finish_non_exhaustive(),
        }
    }
}

impl Telemetry {
    /// The telemetry now (no reservations counted).
    pub fn now(&self) -> std::borrow::Cow<'_, Snapshot> {
        match self {
            Self::Static(s) => std::borrow::Cow::Borrowed(s),
            Self::Live { cache, staleness } => std::borrow::Cow::Owned(
                cache.snapshot(*staleness, k8s_openapi::jiff::Timestamp::now()),
            ),
        }
    }

    /// Waits until the telemetry has been read once (a static view at once).
    pub async fn ready(&self) {
        if let Self::Live { cache, .. } = self {
            cache.ready().await;
        }
    }
}

/// What the routes answer from.
#[derive(Debug, Clone, Default)]
pub struct AppState {
    /// GPU telemetry the extender judges against.
    pub view: Telemetry,
    /// Webhook settings.
    pub webhook: WebhookConfig,
    /// Binds pods through the API server; `None`: `/bind` refuses.
    pub binder: Option<Binder>,
    /// Makes the ResourceClaimTemplates DRA mode's pods name; `None`: a
    /// pod that needs one is refused.
    pub claim_templates: Option<ClaimTemplates>,
    /// What `/metrics` serves.
    pub metrics: Metrics,
    /// The last view with the reservations counted ([`AppState::current`]).
    pub overlay: Overlay,
}

/// The last telemetry view with the binder's reservations counted, by
/// (view id, table version): reused while neither changed.
#[derive(Debug, Clone, Default)]
pub struct Overlay(Arc<std::sync::Mutex<Option<(u64, u64, ClusterView)>>>);

/// Failures of the server itself (never of a request): its settings and
/// its listener.
#[derive(Debug, Error)]
pub enum ServerError {
    /// The listener failed for good.
    #[error("accepting connections failed")]
    Accept(#[source] std::io::Error),
    /// A timeout setting is not a positive number of seconds.
    #[error("{0:?} is not a timeout in seconds (a number more than 0, such as 10 or 0.5)")]
    BadTimeout(String),
}

/// A timeout setting: seconds, more than 0 and finite (`10`, `0.5`).
///
/// # Errors
/// [`ServerError::BadTimeout`] naming the text otherwise.
pub fn parse_timeout(text: &str) -> Result<Duration, ServerError> {
    text.trim()
        .parse::<f64>()
        .ok()
        .filter(|s| *s > 0.0)
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
        .ok_or_else(|| ServerError::BadTimeout(text.to_owned()))
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

impl AppState {
    /// The view one filter or prioritize request is judged against: the
    /// telemetry now, with what the binder has reserved and the telemetry
    /// does not show yet counted on each GPU
    /// ([`crate::bind::reserve::Reservations::apply`]), so a node bind
    /// would refuse fails filter with a reason instead.
    ///
    /// The counted view is kept by (view id, table version) and reused
    /// while neither changed: the version is read before the table is, so
    /// a reservation made meanwhile only costs one more recount.
    pub fn current(&self) -> std::borrow::Cow<'_, Snapshot> {
        let now = self.view.now();
        let Some(binder) = &self.binder else {
            return now;
        };
        let table = binder.table();
        let key = (now.view.id(), table.version());
        let mut memo = self
            .overlay
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let reserved = match memo.as_ref() {
            Some((id, version, view)) if (*id, *version) == key => view.clone(),
            _ => {
                let view = table.apply(&now.view).unwrap_or_else(|| now.view.clone());
                *memo = Some((key.0, key.1, view.clone()));
                view
            }
        };
        drop(memo);
        std::borrow::Cow::Owned(Snapshot {
            view: reserved,
            stale: now.stale.clone(),
        })
    }
}

/// Which routes a listener answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Routes {
    /// Every route: the localhost listener kube-scheduler calls.
    All,
    /// `/webhook` and `/healthz` only: the HTTPS listener the API server
    /// calls, reachable from the cluster network.
    Webhook,
}

impl Routes {
    /// Answers one request, or 404 for a route this listener does not have.
    pub fn route(self, method: &str, path: &str, body: &[u8], state: &AppState) -> Reply {
        match (self, path) {
            (Routes::All, _) | (Routes::Webhook, "/webhook" | "/healthz") => {
                route(method, path, body, state)
            }
            (Routes::Webhook, _) => Reply::text(
                StatusCode::NOT_FOUND,
                &format!("no route {path} on the webhook listener"),
            ),
        }
    }
}

/// Answers one request.
pub fn route(method: &str, path: &str, body: &[u8], state: &AppState) -> Reply {
    match (method, path) {
        ("GET", "/healthz") => Reply::text(StatusCode::OK, "ok"),
        ("POST", "/filter") => Reply::json(&match serde_json::from_slice::<ExtenderArgs>(body) {
            Ok(args) => state.current().filter(&args),
            Err(error) => ExtenderFilterResult {
                error: format!("request body is not ExtenderArgs JSON: {error}"),
                ..ExtenderFilterResult::default()
            },
        }),
        ("POST", "/prioritize") => match serde_json::from_slice::<ExtenderArgs>(body) {
            Ok(args) => Reply::json(&extender::prioritize(&args, &state.current().view)),
            Err(error) => bad_request("ExtenderArgs", &error),
        },
        ("POST", "/bind") => Reply::json(&ExtenderBindingResult {
            error: "this tessera extender has no API client to bind with (serve without --bind); remove bindVerb from the scheduler configuration or start it with --bind".to_owned(),
        }),
        // Without the templates made (that takes the API server: see
        // `dispatch`): a pod that needs one is refused.
        ("POST", "/webhook") => match review(body, state) {
            Ok(reviewed) if reviewed.templates.is_empty() => Reply::json(&reviewed.answer),
            Ok(reviewed) => {
                let error = TemplateError::no_client(&reviewed.templates);
                Reply::json(&reviewed.refused(error.code(), error.full_message()))
            }
            Err(reply) => reply,
        },
        (_, "/healthz" | "/filter" | "/prioritize" | "/bind" | "/webhook" | "/metrics") => {
            Reply::text(StatusCode::METHOD_NOT_ALLOWED, &format!("{method} is not accepted on {path}"))
        }
        _ => Reply::text(StatusCode::NOT_FOUND, &format!("no route {path}")),
    }
}

/// [`Routes::route`], plus the routes that wait on the API server or read
/// the metrics (plain listener only), with each verb's latency and outcome
/// recorded.
pub async fn dispatch(
    routes: Routes,
    method: &str,
    path: &str,
    body: &[u8],
    state: &AppState,
) -> Reply {
    let started = std::time::Instant::now();
    let reply = match (routes, method, path) {
        (_, "POST", "/webhook") => admission(body, state).await,
        (Routes::All, "POST", "/bind") => bind(body, state).await,
        (Routes::All, "GET", "/metrics") => Reply {
            status: StatusCode::OK,
            content_type: "text/plain; version=0.0.4; charset=utf-8",
            body: state
                .metrics
                .render(state.binder.as_ref().map(Binder::table))
                .into_bytes(),
        },
        _ => routes.route(method, path, body, state),
    };
    if let (Routes::All, "POST", verb @ ("/filter" | "/prioritize" | "/bind")) =
        (routes, method, path)
    {
        let verb = verb.trim_start_matches('/');
        state
            .metrics
            .verb_seconds
            .with_label_values(&[verb])
            .observe(started.elapsed().as_secs_f64());
        if verb == "filter" {
            let outcome = match serde_json::from_slice::<ExtenderFilterResult>(&reply.body) {
                Ok(r) if !r.error.is_empty() => {
                    state
                        .metrics
                        .failures
                        .with_label_values(&[verb, "unreadable_pod"])
                        .inc();
                    "error"
                }
                Ok(r) if r.node_names.as_ref().is_some_and(|n| !n.is_empty()) => "schedulable",
                _ => "unschedulable",
            };
            state
                .metrics
                .decisions
                .with_label_values(&[verb, outcome])
                .inc();
        }
    }
    reply
}

/// The AdmissionReview in `body`, judged.
fn review(body: &[u8], state: &AppState) -> Result<webhook::Reviewed, Reply> {
    let incoming = serde_json::from_slice::<AdmissionReview>(body)
        .map_err(|error| bad_request("AdmissionReview", &error))?;
    webhook::review(&incoming, &state.webhook)
        .map_err(|error| Reply::text(StatusCode::BAD_REQUEST, &error.full_message()))
}

/// `/webhook`: the review, with the templates an admitted pod names made
/// before the answer (only read on a dry run); if they cannot be, the pod
/// is refused, naming the template.
async fn admission(body: &[u8], state: &AppState) -> Reply {
    let reviewed = match review(body, state) {
        Ok(reviewed) => reviewed,
        Err(reply) => return reply,
    };
    if reviewed.templates.is_empty() {
        return Reply::json(&reviewed.answer);
    }
    let made = match &state.claim_templates {
        Some(maker) => maker.ensure(&reviewed.templates, reviewed.dry_run).await,
        None => Err(TemplateError::no_client(&reviewed.templates)),
    };
    match made {
        Ok(()) => Reply::json(&reviewed.answer),
        Err(error) => {
            let message = error.full_message();
            tracing::warn!(error = %message, "pod refused: its resourceclaimtemplates are not there");
            Reply::json(&reviewed.refused(error.code(), message))
        }
    }
}

async fn bind(body: &[u8], state: &AppState) -> Reply {
    let args = match serde_json::from_slice::<ExtenderBindingArgs>(body) {
        Ok(args) => args,
        Err(error) => return bad_request("ExtenderBindingArgs", &error),
    };
    let Some(binder) = &state.binder else {
        return route("POST", "/bind", body, state);
    };
    // The binder counts its own table; it gets the telemetry alone.
    let telemetry = state.view.now();
    let result = binder.bind(&args, &telemetry.view).await;
    let m = &state.metrics;
    Reply::json(&match result {
        Ok(_) => {
            m.decisions.with_label_values(&["bind", "bound"]).inc();
            ExtenderBindingResult::default()
        }
        Err(error) => {
            m.decisions.with_label_values(&["bind", "refused"]).inc();
            m.failures
                .with_label_values(&["bind", error.reason()])
                .inc();
            ExtenderBindingResult {
                error: error.full_message(),
            }
        }
    })
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
    limits: Limits,
    routes: Routes,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (parts, body) = request.into_parts();
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    let max = limits.max_body;
    let too_large = |detail: &str| {
        Reply::text(
            StatusCode::PAYLOAD_TOO_LARGE,
            &format!("request body is over the limit of {max} bytes{detail}"),
        )
    };
    // Refuse before reading: a body that never comes must not hold the task.
    let reply = if declared.is_some_and(|n| n > max as u64) {
        Err(too_large(""))
    } else {
        let collect = Limited::new(body, max).collect();
        match tokio::time::timeout(limits.body_read_timeout, collect).await {
            Ok(Ok(collected)) => Ok(dispatch(
                routes,
                parts.method.as_str(),
                parts.uri.path(),
                &collected.to_bytes(),
                &state,
            )
            .await),
            Ok(Err(error)) => Err(too_large(&format!(" or unreadable: {error}"))),
            Err(_) => Err(Reply::text(
                StatusCode::REQUEST_TIMEOUT,
                &format!(
                    "request body not complete within {:?}",
                    limits.body_read_timeout
                ),
            )),
        }
    };
    // A refused body may still be coming: the connection cannot carry
    // another request, so it closes after the answer.
    let (reply, close) = match reply {
        Ok(reply) => (reply, false),
        Err(reply) => (reply, true),
    };
    let mut response = Response::new(Full::new(Bytes::from(reply.body)));
    *response.status_mut() = reply.status;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(reply.content_type),
    );
    if close {
        headers.insert(
            header::CONNECTION,
            header::HeaderValue::from_static("close"),
        );
    }
    Ok(response)
}

/// Serves plain HTTP connections from `listener` under `limits`, every
/// route, until `shutdown` completes.
///
/// # Errors
/// [`ServerError::Accept`] when the listener fails with something other
/// than a passing condition (those are retried after a pause).
pub async fn serve(
    listener: TcpListener,
    state: Arc<AppState>,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServerError> {
    accept_loop(listener, limits, shutdown, move |stream, permit| {
        let state = state.clone();
        tokio::spawn(async move {
            serve_connection(stream, state, limits, Routes::All).await;
            drop(permit);
        });
    })
    .await
}

/// Serves HTTPS connections from `listener` with `config` (its
/// certificate resolver decides the pair each handshake gets), only the
/// webhook routes, until `shutdown` completes. A handshake not finished
/// within [`Limits::header_read_timeout`] drops the connection.
///
/// # Errors
/// [`ServerError::Accept`] as for [`serve`].
pub async fn serve_tls(
    listener: TcpListener,
    config: Arc<rustls::ServerConfig>,
    state: Arc<AppState>,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServerError> {
    let acceptor = TlsAcceptor::from(config);
    accept_loop(listener, limits, shutdown, move |stream, permit| {
        let acceptor = acceptor.clone();
        let state = state.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let handshake =
                tokio::time::timeout(limits.header_read_timeout, acceptor.accept(stream)).await;
            match handshake {
                Ok(Ok(tls)) => serve_connection(tls, state, limits, Routes::Webhook).await,
                Ok(Err(error)) => tracing::debug!(%error, "TLS handshake failed"),
                Err(_) => tracing::debug!(
                    timeout = ?limits.header_read_timeout,
                    "TLS handshake not complete in time; dropped"
                ),
            }
        });
    })
    .await
}

/// Accepts until `shutdown`, one connection per permit of
/// [`Limits::max_connections`]; the permit travels with the connection's
/// task and is returned when it ends.
async fn accept_loop(
    listener: TcpListener,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
    mut spawn: impl FnMut(tokio::net::TcpStream, tokio::sync::OwnedSemaphorePermit),
) -> Result<(), ServerError> {
    let permits = Arc::new(tokio::sync::Semaphore::new(limits.max_connections.max(1)));
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            () = &mut shutdown => return Ok(()),
            permit = permits.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                // Never closed while the loop holds it.
                Err(_) => return Ok(()),
            },
        };
        let accepted = tokio::select! {
            () = &mut shutdown => return Ok(()),
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, _)) => spawn(stream, permit),
            Err(error) if is_transient(&error) => {
                tracing::warn!(%error, "accept failed; retrying");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(error) => return Err(ServerError::Accept(error)),
        }
    }
}

async fn serve_connection<S>(stream: S, state: Arc<AppState>, limits: Limits, routes: Routes)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = service_fn(move |request| handle(request, state.clone(), limits, routes));
    if let Err(error) = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .serve_connection(TokioIo::new(stream), service)
        .await
    {
        tracing::debug!(%error, "connection ended with an error");
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
