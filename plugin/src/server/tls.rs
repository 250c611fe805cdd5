//! The webhook's serving certificate: read from PEM files (a mounted
//! `kubernetes.io/tls` secret), checked, and reloaded when they change.
//!
//! **Invariants.**
//! - A pair is only ever served whole and checked: the certificate chain
//!   and the private key are read together, the key must parse with the
//!   ring provider and match the leaf certificate's public key. A pair
//!   that fails any of that is never served; the previous one stays
//!   and the reason is logged.
//! - Reloading replaces the pair for *new* handshakes only: a connection
//!   keeps the pair it was set up with, so rotation never breaks one.
//! - Change is detected by content, polled every
//!   [`CertReloader::spawn`] interval, so the kubelet's update of a
//!   mounted secret (the `..data` symlink swapped to a new timestamped
//!   directory) is seen whatever the file times say; reading both files
//!   half-way through a swap can give a mismatched pair, which is
//!   refused as above and picked up whole on the next poll.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use thiserror::Error;

/// Why a certificate/key pair cannot be served.
#[derive(Debug, Error)]
pub enum TlsError {
    /// A file cannot be read.
    #[error("reading {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The certificate file holds no PEM certificate (or a broken one).
    #[error("{path} holds no readable PEM certificate")]
    NoCertificate {
        /// The file.
        path: PathBuf,
        /// Cause, when the PEM itself is broken.
        #[source]
        source: Option<rustls::pki_types::pem::Error>,
    },
    /// The key file holds no readable PEM private key.
    #[error("{path} holds no readable PEM private key (PKCS#8, PKCS#1 or SEC1)")]
    NoKey {
        /// The file.
        path: PathBuf,
        /// Cause.
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    /// The key is unusable or does not belong to the certificate.
    #[error("private key {key} does not fit certificate {cert}")]
    Mismatch {
        /// Certificate file.
        cert: PathBuf,
        /// Key file.
        key: PathBuf,
        /// Cause.
        #[source]
        source: rustls::Error,
    },
    /// The TLS settings cannot be built.
    #[error("building the TLS server settings")]
    Config(#[source] rustls::Error),
}

/// The crypto provider every pair is checked and served with.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Where the serving pair lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertFiles {
    /// PEM certificate chain, leaf first (`tls.crt` of the secret).
    pub cert: PathBuf,
    /// PEM private key (`tls.key` of the secret).
    pub key: PathBuf,
}

/// The two files' contents, compared to see whether anything changed.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Snapshot {
    cert: Vec<u8>,
    key: Vec<u8>,
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_owned(),
        source,
    })
}

impl CertFiles {
    fn snapshot(&self) -> Result<Snapshot, TlsError> {
        Ok(Snapshot {
            cert: read(&self.cert)?,
            key: read(&self.key)?,
        })
    }

    /// Reads and checks the pair.
    ///
    /// # Errors
    /// A [`TlsError`] naming the file that is unreadable or wrong.
    pub fn load(&self, provider: &CryptoProvider) -> Result<Arc<CertifiedKey>, TlsError> {
        self.parse(&self.snapshot()?, provider)
    }

    fn parse(
        &self,
        snapshot: &Snapshot,
        provider: &CryptoProvider,
    ) -> Result<Arc<CertifiedKey>, TlsError> {
        let chain = CertificateDer::pem_slice_iter(&snapshot.cert)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|source| TlsError::NoCertificate {
                path: self.cert.clone(),
                source: Some(source),
            })?;
        if chain.is_empty() {
            return Err(TlsError::NoCertificate {
                path: self.cert.clone(),
                source: None,
            });
        }
        let key =
            PrivateKeyDer::from_pem_slice(&snapshot.key).map_err(|source| TlsError::NoKey {
                path: self.key.clone(),
                source,
            })?;
        let mismatch = |source| TlsError::Mismatch {
            cert: self.cert.clone(),
            key: self.key.clone(),
            source,
        };
        let certified = CertifiedKey::from_der(chain, key, provider).map_err(mismatch)?;
        // `from_der` lets "cannot tell" pass; a serving pair must be known
        // to match, or clients would fail every handshake.
        certified.keys_match().map_err(mismatch)?;
        Ok(Arc::new(certified))
    }
}

/// Hands rustls the current pair and replaces it when the files change.
pub struct CertReloader {
    files: CertFiles,
    provider: Arc<CryptoProvider>,
    current: RwLock<(Snapshot, Arc<CertifiedKey>)>,
}

impl fmt::Debug for CertReloader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertReloader")
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

impl CertReloader {
    /// Loads the first pair; serving never starts without a good one.
    ///
    /// # Errors
    /// A [`TlsError`] when the pair cannot be served.
    pub fn new(files: CertFiles) -> Result<Arc<Self>, TlsError> {
        let provider = provider();
        let snapshot = files.snapshot()?;
        let key = files.parse(&snapshot, &provider)?;
        Ok(Arc::new(Self {
            files,
            provider,
            current: RwLock::new((snapshot, key)),
        }))
    }

    /// Re-reads the files; swaps in the pair if it changed and is good.
    /// Returns whether a new pair is now served.
    ///
    /// # Errors
    /// Why a changed pair was refused (the previous one stays served), or
    /// why the files could not be read.
    pub fn reload(&self) -> Result<bool, TlsError> {
        let snapshot = self.files.snapshot()?;
        if self.current.read().is_ok_and(|c| c.0 == snapshot) {
            return Ok(false);
        }
        let key = self.files.parse(&snapshot, &self.provider)?;
        let mut current = self
            .current
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *current = (snapshot, key);
        Ok(true)
    }

    /// Polls the files every `interval` on the current tokio runtime,
    /// logging each change and each refused pair (once per distinct
    /// content, not on every poll).
    pub fn spawn(self: &Arc<Self>, interval: Duration) -> tokio::task::JoinHandle<()> {
        let this = self.clone();
        tokio::spawn(async move {
            let mut last_error = String::new();
            loop {
                tokio::time::sleep(interval).await;
                match this.reload() {
                    Ok(true) => {
                        last_error.clear();
                        tracing::info!(cert = %this.files.cert.display(), "serving a new certificate");
                    }
                    Ok(false) => last_error.clear(),
                    Err(error) => {
                        let message = crate::error_chain::with_causes(&error);
                        if message != last_error {
                            tracing::warn!(error = %message, "keeping the previous certificate");
                            last_error = message;
                        }
                    }
                }
            }
        })
    }

    /// rustls server settings that take their certificate from `self`,
    /// HTTP/1.1 only.
    ///
    /// # Errors
    /// [`TlsError::Config`] when the provider offers no usable protocol.
    pub fn server_config(self: &Arc<Self>) -> Result<Arc<rustls::ServerConfig>, TlsError> {
        let mut config = rustls::ServerConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(TlsError::Config)?
            .with_no_client_auth()
            .with_cert_resolver(self.clone());
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

impl ResolvesServerCert for CertReloader {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let current = self
            .current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Some(current.1.clone())
    }
}
