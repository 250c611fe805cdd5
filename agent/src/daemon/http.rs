//! The daemon's HTTP endpoint (hyper 1, HTTP/1.1): [`route`] answers,
//! [`serve`] moves bytes.
//!
//! | route | answer |
//! |---|---|
//! | `GET /healthz` | 200 while the process answers and the loop is not wedged, else 503 |
//! | `GET /readyz` | 200 once NVML is initialised, the first period is done and (with the device plugin) it is registered with kubelet, else 503 with the reasons |
//! | `GET /containers` | the last period's view of the containers (JSON) |
//! | `GET /metrics` | Prometheus series of the last period (text format 0.0.4, [`crate::metrics`]) |

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode, header};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use crate::metrics::Metrics;
use crate::view::status::{Status, Verdict};

/// An answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// Status code.
    pub status: StatusCode,
    /// Content type.
    pub content_type: &'static str,
    /// Body.
    pub body: Vec<u8>,
}

fn text(status: StatusCode, text: &str) -> Reply {
    Reply {
        status,
        content_type: "text/plain; charset=utf-8",
        body: format!("{text}\n").into_bytes(),
    }
}

fn verdict(v: Verdict) -> Reply {
    let code = if v.ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    text(code, &v.detail)
}

/// Answers `method path`.
pub fn route(method: &str, path: &str, status: &Status, metrics: &Metrics) -> Reply {
    match (method, path) {
        ("GET" | "HEAD", "/healthz") => verdict(status.health()),
        ("GET" | "HEAD", "/readyz") => verdict(status.ready()),
        ("GET" | "HEAD", "/containers") => Reply {
            status: StatusCode::OK,
            content_type: "application/json",
            body: serde_json::to_vec_pretty(&status.view()).unwrap_or_default(),
        },
        ("GET" | "HEAD", "/metrics") => match metrics.render() {
            Ok(body) => Reply {
                status: StatusCode::OK,
                content_type: crate::metrics::CONTENT_TYPE,
                body: body.into_bytes(),
            },
            Err(e) => text(
                StatusCode::INTERNAL_SERVER_ERROR,
                &crate::error_chain::with_causes(&e),
            ),
        },
        (_, "/healthz" | "/readyz" | "/containers" | "/metrics") => text(
            StatusCode::METHOD_NOT_ALLOWED,
            &format!("{method} is not accepted on {path}; accepted: GET"),
        ),
        _ => text(
            StatusCode::NOT_FOUND,
            &format!("no route {path}; routes: /healthz, /readyz, /containers, /metrics"),
        ),
    }
}

async fn handle(
    request: Request<Incoming>,
    status: Arc<Status>,
    metrics: Arc<Metrics>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let reply = route(
        request.method().as_str(),
        request.uri().path(),
        &status,
        &metrics,
    );
    let mut response = Response::new(Full::new(Bytes::from(reply.body)));
    *response.status_mut() = reply.status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(reply.content_type),
    );
    Ok(response)
}

/// Serves `listener` until `shutdown` completes. Accept errors are logged
/// and retried after a pause (a full descriptor table passes).
pub async fn serve(
    listener: TcpListener,
    status: Arc<Status>,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            () = &mut shutdown => return,
            a = listener.accept() => a,
        };
        let stream = match accepted {
            Ok((s, _)) => s,
            Err(error) => {
                tracing::warn!(%error, "accepting a connection failed; retrying");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let (status, metrics) = (status.clone(), metrics.clone());
        tokio::spawn(async move {
            let service = service_fn(move |r| handle(r, status.clone(), metrics.clone()));
            // A client that never finishes its request is dropped.
            let conn = http1::Builder::new()
                .header_read_timeout(Some(Duration::from_secs(10)))
                .timer(hyper_util::rt::TokioTimer::new())
                .serve_connection(TokioIo::new(stream), service);
            if let Err(error) = conn.await {
                tracing::debug!(%error, "connection ended with an error");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        let s = Status::new(Duration::from_secs(5));
        let m = Metrics::new().unwrap();
        assert_eq!(route("GET", "/healthz", &s, &m).status, StatusCode::OK);
        assert_eq!(
            route("GET", "/readyz", &s, &m).status,
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(
            route("POST", "/healthz", &s, &m).status,
            StatusCode::METHOD_NOT_ALLOWED
        );
        assert_eq!(route("GET", "/x", &s, &m).status, StatusCode::NOT_FOUND);
        let metrics = route("GET", "/metrics", &s, &m);
        assert_eq!(metrics.status, StatusCode::OK);
        assert_eq!(metrics.content_type, "text/plain; version=0.0.4");
    }
}
