//! Registering with kubelet (`v1beta1.Registration/Register` on
//! `kubelet.sock`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use tessera_kubelet_api::deviceplugin::VERSION;
use tessera_kubelet_api::deviceplugin::v1beta1 as dp;

use super::socket::{self, SocketError};

/// How long one registration may take.
const REGISTER_TIMEOUT: Duration = Duration::from_secs(2);

/// Why a registration failed.
#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    /// Kubelet's socket does not answer.
    #[error("cannot reach kubelet")]
    Connect(#[source] SocketError),
    /// Kubelet refused the registration.
    #[error("kubelet at {path} refused to register {resource}: {message}")]
    Refused {
        /// Kubelet's socket.
        path: PathBuf,
        /// Our resource name.
        resource: String,
        /// Kubelet's message.
        message: String,
        /// Cause.
        #[source]
        source: tonic::Status,
    },
}

/// Registers `resource` served on `endpoint` (a file name in kubelet's
/// directory) with the kubelet at `kubelet_sock`.
pub async fn register(
    kubelet_sock: &Path,
    endpoint: &str,
    resource: &str,
) -> Result<(), RegisterError> {
    let channel = socket::channel(kubelet_sock, REGISTER_TIMEOUT)
        .await
        .map_err(RegisterError::Connect)?;
    let mut client = dp::registration_client::RegistrationClient::new(channel);
    client
        .register(dp::RegisterRequest {
            version: VERSION.to_owned(),
            endpoint: endpoint.to_owned(),
            resource_name: resource.to_owned(),
            options: Some(super::device_plugin::OPTIONS),
        })
        .await
        .map_err(|source| RegisterError::Refused {
            path: kubelet_sock.to_owned(),
            resource: resource.to_owned(),
            message: source.message().to_owned(),
            source,
        })?;
    Ok(())
}
