//! A round-robin TCP balancer on loopback: what a Kubernetes ClusterIP does to connections (each
//! new one goes to the next backend; a connection stays on the backend it was given). Backends
//! can be added while it runs, as a Deployment scales out.
#![allow(dead_code)]

use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};

pub struct Balancer {
    pub port: u16,
    backends: Arc<Mutex<Vec<u16>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Balancer {
    /// Starts balancing 127.0.0.1:<port> over 127.0.0.1:<backend> for each of `backends`.
    pub async fn start(backends: &[u16]) -> Balancer {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().unwrap().port();
        let backends = Arc::new(Mutex::new(backends.to_vec()));
        let shared = backends.clone();
        let task = tokio::spawn(async move {
            let mut next = 0usize;
            while let Ok((mut client, _)) = listener.accept().await {
                let backend = {
                    let list = shared.lock().unwrap();
                    next = next.wrapping_add(1);
                    list[next % list.len()]
                };
                tokio::spawn(async move {
                    if let Ok(mut server) = TcpStream::connect(("127.0.0.1", backend)).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
            }
        });
        Balancer {
            port,
            backends,
            task,
        }
    }

    /// Adds a backend: new connections go to it in turn.
    pub fn add(&self, backend: u16) {
        self.backends.lock().unwrap().push(backend);
    }
}

impl Drop for Balancer {
    fn drop(&mut self) {
        self.task.abort();
    }
}
