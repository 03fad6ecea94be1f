//! TLS for the gRPC listener, optionally verifying client certificates (mTLS), with the files
//! re-read when they change (through `watch`, like the rules): certificates are rotated
//! (cert-manager, a Kubernetes secret) without a restart. Each accepted connection is handshaken
//! with whichever rustls config is current; a rotated set that does not load is refused, logged,
//! and the previous one stays in use. It must never serve without the configured client check.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc, watch};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use super::listen::accept_loop;
use super::watch::{Refusal, Watched};
use crate::telemetry::Metrics;

/// Where the server's certificate, key and (for mTLS) client CA come from.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: Option<PathBuf>,
    /// A name (DNS SAN) every client certificate must carry, on top of the CA's signature.
    pub client_san: Option<String>,
}

#[derive(Debug, thiserror::Error)]
#[error("TLS files: {0}")]
pub struct TlsError(String);

/// The bytes of the TLS files, read once: what is fingerprinted is what is loaded.
pub struct TlsBytes {
    cert: Vec<u8>,
    key: Vec<u8>,
    client_ca: Option<Vec<u8>>,
}

impl TlsFiles {
    /// Reads the files; the fingerprint covers exactly the bytes returned.
    pub fn read(&self) -> Result<(u64, TlsBytes), TlsError> {
        let read = |path: &Path| {
            std::fs::read(path).map_err(|e| TlsError(format!("{}: {e}", path.display())))
        };
        let bytes = TlsBytes {
            cert: read(&self.cert)?,
            key: read(&self.key)?,
            client_ca: self.client_ca.as_deref().map(read).transpose()?,
        };
        let mut hasher = DefaultHasher::new();
        bytes.cert.hash(&mut hasher);
        bytes.key.hash(&mut hasher);
        bytes.client_ca.hash(&mut hasher);
        Ok((hasher.finish(), bytes))
    }

    /// Builds a rustls config (HTTP/2 only: gRPC) from bytes read from these files.
    pub fn load(&self, bytes: &TlsBytes) -> Result<Arc<ServerConfig>, TlsError> {
        let context =
            |path: &Path, e: &dyn std::fmt::Display| TlsError(format!("{}: {e}", path.display()));
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&bytes.cert)
            .collect::<Result<_, _>>()
            .map_err(|e| context(&self.cert, &e))?;
        if certs.is_empty() {
            return Err(context(&self.cert, &"no certificate in the file"));
        }
        let key = PrivateKeyDer::from_pem_slice(&bytes.key).map_err(|e| context(&self.key, &e))?;
        let builder = ServerConfig::builder();
        let builder = match (&self.client_ca, &bytes.client_ca) {
            (Some(ca), Some(ca_bytes)) => {
                let mut roots = rustls::RootCertStore::empty();
                for cert in CertificateDer::pem_slice_iter(ca_bytes) {
                    roots
                        .add(cert.map_err(|e| context(ca, &e))?)
                        .map_err(|e| context(ca, &e))?;
                }
                let verifier = WebPkiClientVerifier::builder(Arc::new(roots))
                    .build()
                    .map_err(|e| context(ca, &e))?;
                builder.with_client_cert_verifier(verifier)
            }
            _ => builder.with_no_client_auth(),
        };
        let mut config = builder.with_single_cert(certs, key).map_err(|e| {
            TlsError(format!(
                "{} and {}: {e}",
                self.cert.display(),
                self.key.display()
            ))
        })?;
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(Arc::new(config))
    }
}

/// The TLS config in force, re-loaded by the file watcher when the files change.
pub struct TlsWatch {
    files: TlsFiles,
    pub current: Arc<ArcSwap<ServerConfig>>,
}

impl TlsWatch {
    /// The name client certificates must carry, if one is required.
    pub fn client_san(&self) -> Option<String> {
        self.files.client_san.clone()
    }
}

/// Whether the client certificate of `stream` carries `san` (its first certificate: the client's
/// own, which the verifier already tied to the CA).
fn carries_name(stream: &TlsStream<TcpStream>, san: &str) -> bool {
    let Some(cert) = stream
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
    else {
        return false;
    };
    let Ok(name) = rustls::pki_types::ServerName::try_from(san) else {
        return false;
    };
    webpki::EndEntityCert::try_from(cert)
        .is_ok_and(|cert| cert.verify_is_valid_for_subject_name(&name).is_ok())
}

impl TlsWatch {
    /// Loads the files once (start-up fails on files that do not load); returns the watch and
    /// the fingerprint of what is in force.
    pub fn load(files: TlsFiles) -> Result<(TlsWatch, u64), TlsError> {
        let (fingerprint, bytes) = files.read()?;
        let config = files.load(&bytes)?;
        let watch = TlsWatch {
            files,
            current: Arc::new(ArcSwap::new(config)),
        };
        Ok((watch, fingerprint))
    }
}

impl Watched for TlsWatch {
    type Content = TlsBytes;

    fn what(&self) -> String {
        format!("gRPC TLS certificate {}", self.files.cert.display())
    }

    fn read(&self) -> Result<(u64, TlsBytes), String> {
        self.files.read().map_err(|e| e.to_string())
    }

    fn apply(&self, bytes: TlsBytes) -> Result<String, Refusal> {
        let config = self
            .files
            .load(&bytes)
            .map_err(|e| Refusal::Invalid(e.to_string()))?;
        self.current.store(config);
        Ok("new certificate in use for new connections".into())
    }
}

/// Handshakes in progress at once, at most; past it the listener stops accepting until one ends
/// (the kernel queues the rest), so a flood of idle TLS clients costs bounded memory.
pub const MAX_HANDSHAKES: usize = 256;
/// A client that has not finished its handshake by then is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// Accepts TCP connections (`listen::accept_loop`: backs off on errors), handshakes TLS with the
/// config in force, and yields the TLS streams for tonic. Handshakes run concurrently, each
/// bounded in time and at most `MAX_HANDSHAKES` at once, so one slow client holds up nobody.
pub fn incoming(
    listener: TcpListener,
    current: Arc<ArcSwap<ServerConfig>>,
    client_san: Option<String>,
    metrics: Arc<Metrics>,
    stop: watch::Receiver<bool>,
) -> tokio_stream::wrappers::ReceiverStream<std::io::Result<TlsStream<TcpStream>>> {
    let (sender, receiver) = mpsc::channel(64);
    let permits = Arc::new(Semaphore::new(MAX_HANDSHAKES));
    tokio::spawn(accept_loop(
        listener,
        "grpc",
        metrics,
        stop,
        move |tcp, peer| {
            let (sender, permits) = (sender.clone(), permits.clone());
            let client_san = client_san.clone();
            let acceptor = TlsAcceptor::from(current.load_full());
            async move {
                let Ok(permit) = permits.acquire_owned().await else {
                    return false;
                };
                let _ = tcp.set_nodelay(true);
                let open = !sender.is_closed();
                tokio::spawn(async move {
                    let _permit = permit;
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                        Ok(Ok(stream)) => {
                            if let Some(san) = &client_san
                                && !carries_name(&stream, san)
                            {
                                tracing::debug!(%peer, %san, "client certificate without the required name");
                                return;
                            }
                            let _ = sender.send(Ok(stream)).await;
                        }
                        Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                    }
                });
                open
            }
        },
    ));
    tokio_stream::wrappers::ReceiverStream::new(receiver)
}
