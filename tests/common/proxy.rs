//! A loopback TCP proxy in front of a server, for faults on the wire that a real server cannot be
//! asked for: a slow connection set-up (the first bytes of each connection held back),
//! connections cut after the server has answered but before the answer reaches the client, added
//! latency on every answer, and a partition (nothing crosses, connections stay open, what was held
//! is delivered when it heals, as TCP would).
#![allow(dead_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[derive(Default)]
struct Faults {
    /// Held back before anything is forwarded on a new connection.
    setup_delay_ms: AtomicUsize,
    /// The next answer from the server is dropped and the connection reset.
    cut_next_answer: AtomicBool,
    /// Held back before each answer is passed on.
    answer_delay_ms: AtomicUsize,
    /// While set, no byte crosses either way.
    partitioned: AtomicBool,
    connections: AtomicUsize,
    cut: AtomicUsize,
}

pub struct Proxy {
    pub port: u16,
    faults: Arc<Faults>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Starts forwarding 127.0.0.1:<port> to 127.0.0.1:<upstream>.
    pub async fn start(upstream: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let port = listener.local_addr().unwrap().port();
        let faults = Arc::new(Faults::default());
        let shared = faults.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let faults = shared.clone();
                faults.connections.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let delay = faults.setup_delay_ms.load(Ordering::SeqCst) as u64;
                    if delay > 0 {
                        tokio::time::sleep(Duration::from_millis(delay)).await;
                    }
                    let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
                        return;
                    };
                    forward(client, server, faults).await;
                });
            }
        });
        Proxy { port, faults, task }
    }

    /// Every new connection waits this long before its first byte goes either way.
    pub fn delay_setup(&self, delay: Duration) {
        self.faults
            .setup_delay_ms
            .store(delay.as_millis() as usize, Ordering::SeqCst);
    }

    /// The next answer the server sends is dropped and that connection reset.
    pub fn cut_next_answer(&self) {
        self.faults.cut_next_answer.store(true, Ordering::SeqCst);
    }

    /// Every answer from now on waits this long before it is passed on (zero: none).
    pub fn delay_answers(&self, delay: Duration) {
        self.faults
            .answer_delay_ms
            .store(delay.as_millis() as usize, Ordering::SeqCst);
    }

    /// While `on`, nothing crosses either way; connections stay open and what waits is delivered
    /// once it heals.
    pub fn partition(&self, on: bool) {
        self.faults.partitioned.store(on, Ordering::SeqCst);
    }

    pub fn connections(&self) -> usize {
        self.faults.connections.load(Ordering::SeqCst)
    }

    pub fn cuts(&self) -> usize {
        self.faults.cut.load(Ordering::SeqCst)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Waits while the link is partitioned (polled: a test fault, not a hot path; bounded by the test).
async fn while_partitioned(faults: &Faults) {
    while faults.partitioned.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn forward(client: TcpStream, server: TcpStream, faults: Arc<Faults>) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let up = async {
        let mut buffer = vec![0u8; 16 * 1024];
        loop {
            match client_read.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    while_partitioned(&faults).await;
                    if server_write.write_all(&buffer[..n]).await.is_err() {
                        break;
                    }
                }
            }
        }
    };
    let down = async {
        let mut buffer = vec![0u8; 16 * 1024];
        loop {
            match server_read.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if faults.cut_next_answer.swap(false, Ordering::SeqCst) {
                        faults.cut.fetch_add(1, Ordering::SeqCst);
                        break;
                    }
                    let delay = faults.answer_delay_ms.load(Ordering::SeqCst) as u64;
                    if delay > 0 {
                        tokio::time::sleep(Duration::from_millis(delay)).await;
                    }
                    while_partitioned(&faults).await;
                    if client_write.write_all(&buffer[..n]).await.is_err() {
                        break;
                    }
                }
            }
        }
    };
    // Either direction ending ends the connection (both halves are dropped).
    tokio::select! {
        _ = up => {}
        _ = down => {}
    }
}
