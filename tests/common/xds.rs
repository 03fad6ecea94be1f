//! An in-process xDS control plane (tonic) for the rules-over-xDS tests: it records what the
//! client sends and sends what the test says on the stream open at the moment. Loopback only.
#![allow(dead_code)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use portcullis::pb::xds::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer, DiscoveryRequest,
    DiscoveryResponse, RULES_TYPE_URL, rules as pb,
};
use prost::Message;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

type Outbound = mpsc::Sender<Result<DiscoveryResponse, Status>>;

/// The control plane: records what the client sends, and sends what the test says on the stream
/// open at the moment.
#[derive(Clone)]
pub struct ControlPlane {
    requests: mpsc::UnboundedSender<DiscoveryRequest>,
    current: Arc<Mutex<Option<Outbound>>>,
    streams: Arc<Mutex<Vec<tonic::metadata::MetadataMap>>>,
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for ControlPlane {
    type StreamAggregatedResourcesStream = ReceiverStream<Result<DiscoveryResponse, Status>>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        self.streams
            .lock()
            .unwrap()
            .push(request.metadata().clone());
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(8);
        *self.current.lock().unwrap() = Some(tx);
        let requests = self.requests.clone();
        tokio::spawn(async move {
            while let Ok(Some(r)) = inbound.message().await {
                if requests.send(r).is_err() {
                    break;
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

pub struct Harness {
    plane: ControlPlane,
    requests: mpsc::UnboundedReceiver<DiscoveryRequest>,
    pub addr: std::net::SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Harness {
    pub async fn start(tls: Option<tonic::transport::ServerTlsConfig>) -> Harness {
        Self::start_at(0, tls).await
    }

    pub async fn start_at(port: u16, tls: Option<tonic::transport::ServerTlsConfig>) -> Harness {
        let (tx, requests) = mpsc::unbounded_channel();
        let plane = ControlPlane {
            requests: tx,
            current: Arc::default(),
            streams: Arc::default(),
        };
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let mut builder = tonic::transport::Server::builder();
        if let Some(tls) = tls {
            builder = builder.tls_config(tls).unwrap();
        }
        let router = builder.add_service(AggregatedDiscoveryServiceServer::new(plane.clone()));
        let task = tokio::spawn(async move {
            router
                .serve_with_incoming_shutdown(
                    tokio_stream::wrappers::TcpListenerStream::new(listener),
                    async {
                        let _ = stopped.await;
                    },
                )
                .await
                .unwrap();
        });
        Harness {
            plane,
            requests,
            addr,
            stop: Some(stop),
            task,
        }
    }

    /// The next request from the client (10 s at most).
    pub async fn next(&mut self) -> DiscoveryRequest {
        tokio::time::timeout(Duration::from_secs(10), self.requests.recv())
            .await
            .expect("a request from the client within 10 s")
            .expect("control plane alive")
    }

    pub async fn push(&self, version: &str, nonce: &str, configs: &[pb::RateLimitConfig]) {
        let response = DiscoveryResponse {
            version_info: version.into(),
            resources: configs
                .iter()
                .map(|c| prost_types::Any {
                    type_url: RULES_TYPE_URL.into(),
                    value: c.encode_to_vec(),
                })
                .collect(),
            canary: false,
            type_url: RULES_TYPE_URL.into(),
            nonce: nonce.into(),
        };
        let tx = self
            .plane
            .current
            .lock()
            .unwrap()
            .clone()
            .expect("a stream");
        tx.send(Ok(response)).await.expect("stream open");
    }

    /// Ends the open stream with an error, as a restarting control plane would.
    pub async fn break_stream(&self) {
        let tx = self.plane.current.lock().unwrap().take().expect("a stream");
        tx.send(Err(Status::unavailable("control plane restarting")))
            .await
            .expect("stream open");
    }

    /// The gRPC metadata (headers) the client sent when it opened stream `n`.
    pub fn stream_metadata(&self, n: usize) -> tonic::metadata::MetadataMap {
        self.plane.streams.lock().unwrap()[n].clone()
    }

    pub fn streams(&self) -> usize {
        self.plane.streams.lock().unwrap().len()
    }

    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        // Streams stay open until the client leaves; the task is stopped either way.
        self.task.abort();
        let _ = self.task.await;
    }
}

impl Harness {
    /// Answers the first request of every stream from node `node_id` with `configs` as
    /// `version`, as a control plane holding one snapshot for that node does (go-control-plane's
    /// snapshot cache keyed by node id: another node gets nothing), until the runtime ends.
    pub fn serve_snapshot(
        mut self,
        node_id: &'static str,
        version: &'static str,
        configs: Vec<pb::RateLimitConfig>,
    ) {
        tokio::spawn(async move {
            while let Some(request) = self.requests.recv().await {
                let from_node = request.node.as_ref().is_some_and(|n| n.id == node_id);
                if from_node && request.response_nonce.is_empty() {
                    self.push(version, "snapshot", &configs).await;
                }
            }
        });
    }
}
