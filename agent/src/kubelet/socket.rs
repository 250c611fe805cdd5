//! Unix sockets for gRPC: our listener, a client channel to a socket path,
//! and the identity of a socket file (to notice it being recreated).

use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::{UnixListener, UnixStream};
use tonic::transport::{Channel, Endpoint, Uri};

/// What went wrong with a socket.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    /// Something that is not a socket is in the way.
    #[error("{path} exists and is not a socket")]
    NotASocket {
        /// The path.
        path: PathBuf,
    },
    /// A stale socket could not be removed.
    #[error("cannot remove the stale socket {path}")]
    Remove {
        /// The path.
        path: PathBuf,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// Binding failed.
    #[error("cannot listen on {path}")]
    Bind {
        /// The path.
        path: PathBuf,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// Connecting failed.
    #[error("cannot connect to {path}")]
    Connect {
        /// The path.
        path: PathBuf,
        /// Cause.
        #[source]
        source: tonic::transport::Error,
    },
}

/// A socket file's identity: device, inode and change time. A recreated
/// file differs even where the file system hands out the old inode number
/// again, since its change time (nanoseconds) is the creation's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileId {
    dev: u64,
    ino: u64,
    ctime: i64,
    ctime_nsec: i64,
}

/// The identity of the socket at `path`, `None` when there is none.
pub fn socket_id(path: &Path) -> Option<FileId> {
    let m = std::fs::symlink_metadata(path).ok()?;
    m.file_type().is_socket().then(|| FileId {
        dev: m.dev(),
        ino: m.ino(),
        ctime: m.ctime(),
        ctime_nsec: m.ctime_nsec(),
    })
}

/// Listens on `path`, replacing a stale socket there (never another kind
/// of file).
pub fn bind(path: &Path) -> Result<UnixListener, SocketError> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            std::fs::remove_file(path).map_err(|source| SocketError::Remove {
                path: path.to_owned(),
                source,
            })?;
        }
        Ok(_) => {
            return Err(SocketError::NotASocket {
                path: path.to_owned(),
            });
        }
        Err(_) => {}
    }
    UnixListener::bind(path).map_err(|source| SocketError::Bind {
        path: path.to_owned(),
        source,
    })
}

/// A gRPC channel to the socket at `path` (connected now, within
/// `timeout`).
pub async fn channel(path: &Path, timeout: Duration) -> Result<Channel, SocketError> {
    let target = path.to_owned();
    // The URI is required by the HTTP/2 layer and never resolved.
    Endpoint::from_static("http://localhost")
        .connect_timeout(timeout)
        .timeout(timeout)
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let target = target.clone();
            async move { UnixStream::connect(target).await.map(TokioIo::new) }
        }))
        .await
        .map_err(|source| SocketError::Connect {
            path: path.to_owned(),
            source,
        })
}
