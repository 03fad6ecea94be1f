//! TLS for the gRPC listener, optionally verifying client certificates (mTLS), with the files
//! re-read when they change: certificates are rotated (cert-manager, a Kubernetes secret) without
//! a restart. Each accepted connection is handshaken with whichever rustls config is current; a
//! rotated set that does not load is refused, logged, and the previous one stays in use.

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
use tokio::sync::{mpsc, watch};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

/// Where the server's certificate, key and (for mTLS) client CA come from.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
#[error("TLS files: {0}")]
pub struct TlsError(String);

impl TlsFiles {
    fn paths(&self) -> impl Iterator<Item = &Path> {
        [
            Some(self.cert.as_path()),
            Some(self.key.as_path()),
            self.client_ca.as_deref(),
        ]
        .into_iter()
        .flatten()
    }

    fn fingerprint(&self) -> u64 {
        let mut hasher = DefaultHasher::new();
        for path in self.paths() {
            std::fs::read(path).ok().hash(&mut hasher);
        }
        hasher.finish()
    }

    /// Reads the files into a rustls config (HTTP/2 only: gRPC).
    pub fn load(&self) -> Result<Arc<ServerConfig>, TlsError> {
        let context =
            |path: &Path, e: &dyn std::fmt::Display| TlsError(format!("{}: {e}", path.display()));
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&self.cert)
            .map_err(|e| context(&self.cert, &e))?
            .collect::<Result<_, _>>()
            .map_err(|e| context(&self.cert, &e))?;
        if certs.is_empty() {
            return Err(context(&self.cert, &"no certificate in the file"));
        }
        let key = PrivateKeyDer::from_pem_file(&self.key).map_err(|e| context(&self.key, &e))?;
        let builder = ServerConfig::builder();
        let builder = match &self.client_ca {
            None => builder.with_no_client_auth(),
            Some(ca) => {
                let mut roots = rustls::RootCertStore::empty();
                for cert in CertificateDer::pem_file_iter(ca).map_err(|e| context(ca, &e))? {
                    roots
                        .add(cert.map_err(|e| context(ca, &e))?)
                        .map_err(|e| context(ca, &e))?;
                }
                let verifier = WebPkiClientVerifier::builder(Arc::new(roots))
                    .build()
                    .map_err(|e| context(ca, &e))?;
                builder.with_client_cert_verifier(verifier)
            }
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

/// Accepts TCP connections, handshakes TLS with the current config, and yields the TLS streams
/// for tonic. Handshakes run concurrently, each bounded, so one slow client holds up nobody.
pub fn incoming(
    listener: TcpListener,
    files: TlsFiles,
    reload_interval: Duration,
    mut stop: watch::Receiver<bool>,
) -> Result<tokio_stream::wrappers::ReceiverStream<std::io::Result<TlsStream<TcpStream>>>, TlsError>
{
    let current = Arc::new(ArcSwap::new(files.load()?));
    let (sender, receiver) = mpsc::channel(64);
    let watched = current.clone();
    let mut watch_stop = stop.clone();
    tokio::spawn(async move {
        let mut applied = files.fingerprint();
        let mut ticker = tokio::time::interval(reload_interval);
        loop {
            tokio::select! {
                _ = ticker.tick() => {}
                _ = watch_stop.wait_for(|s| *s) => break,
            }
            let seen = files.fingerprint();
            if seen == applied {
                continue;
            }
            applied = seen;
            match files.load() {
                Ok(config) => {
                    watched.store(config);
                    tracing::info!(cert = %files.cert.display(), "gRPC TLS certificate reloaded");
                }
                Err(e) => {
                    tracing::error!(error = %e, "new gRPC TLS files refused; the previous ones stay in use")
                }
            }
        }
    });
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                _ = stop.wait_for(|s| *s) => break,
            };
            let (tcp, peer) = match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    continue;
                }
            };
            let _ = tcp.set_nodelay(true);
            let acceptor = TlsAcceptor::from(current.load_full());
            let sender = sender.clone();
            tokio::spawn(async move {
                match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await {
                    Ok(Ok(stream)) => {
                        let _ = sender.send(Ok(stream)).await;
                    }
                    Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                    Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                }
            });
        }
    });
    Ok(tokio_stream::wrappers::ReceiverStream::new(receiver))
}
