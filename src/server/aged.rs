//! A gRPC connection's hard end: `--grpc-max-connection-age` plus its grace after it was accepted,
//! the connection reads end of stream and writes fail, so the HTTP/2 server drops it whatever its
//! client is doing. Why here and not in tonic: given a grace, tonic 0.14 sleeps the age and the
//! grace and then drops the connection, without the GOAWAY at the age that tells the client to
//! move (Envoy kept sending new calls on it until the grace ended, measured in
//! tests/envoy/connection_age.rs). So tonic is given the age alone (GOAWAY at the age, the
//! gRPC and Go behaviour) and this wrapper ends the connection at age + grace. It must never end
//! a connection earlier than that.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};
use tonic::transport::server::Connected;

pub struct Aged<T> {
    inner: T,
    /// None: the connection has no end of its own.
    ends: Option<Pin<Box<Sleep>>>,
}

impl<T> Aged<T> {
    /// `inner`, ended `lifetime` from now (never when None).
    pub fn new(inner: T, lifetime: Option<Duration>) -> Aged<T> {
        Aged {
            inner,
            ends: lifetime.map(|l| Box::pin(tokio::time::sleep_until(Instant::now() + l))),
        }
    }

    /// Whether its end has come; polling the timer also wakes a task waiting on the connection
    /// when it does.
    fn ended(&mut self, cx: &mut Context<'_>) -> bool {
        self.ends
            .as_mut()
            .is_some_and(|ends| ends.as_mut().poll(cx).is_ready())
    }
}

/// Wraps each accepted connection of a listener's stream (`Stream::map`), ending it `lifetime`
/// after it was accepted.
pub fn ending<T>(lifetime: Option<Duration>) -> impl FnMut(io::Result<T>) -> io::Result<Aged<T>> {
    move |accepted| accepted.map(|io| Aged::new(io, lifetime))
}

fn ended_error() -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionAborted,
        "the connection's maximum age and grace have passed",
    )
}

impl<T: AsyncRead + Unpin> AsyncRead for Aged<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.ended(cx) {
            // End of stream: the server closes the connection.
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Aged<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.ended(cx) {
            return Poll::Ready(Err(ended_error()));
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl<T: Connected> Connected for Aged<T> {
    type ConnectInfo = T::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn a_connection_ends_at_its_lifetime_and_not_before() {
        let lifetime = Duration::from_millis(200);
        let (ours, mut peer) = tokio::io::duplex(64);
        let started = Instant::now();
        let mut aged = Aged::new(ours, Some(lifetime));
        peer.write_all(b"ab").await.unwrap();
        let mut buf = [0u8; 8];
        assert_eq!(aged.read(&mut buf).await.unwrap(), 2);
        aged.write_all(b"cd").await.unwrap();
        // A read waiting on a silent peer is woken at the end and reads end of stream.
        assert_eq!(aged.read(&mut buf).await.unwrap(), 0);
        let ended = started.elapsed();
        assert!(
            ended >= lifetime && ended < Duration::from_secs(5),
            "{ended:?}"
        );
        assert_eq!(
            aged.write_all(b"ef").await.unwrap_err().kind(),
            io::ErrorKind::ConnectionAborted
        );
        // The peer is still open: only the lifetime ended it.
        peer.write_all(b"gh").await.unwrap();
    }

    #[tokio::test]
    async fn without_a_lifetime_a_connection_does_not_end() {
        let (ours, mut peer) = tokio::io::duplex(64);
        let mut aged = Aged::new(ours, None);
        peer.write_all(b"ab").await.unwrap();
        drop(peer);
        let mut text = Vec::new();
        aged.read_to_end(&mut text).await.unwrap();
        assert_eq!(text, b"ab");
    }
}
