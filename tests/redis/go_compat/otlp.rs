//! The Go service's tracing variables: OTLP over HTTP to a collector of the test's own.

use super::*;

/// Reads one HTTP/1.1 request (headers, then a Content-Length body) and answers 200.
async fn receive_post(stream: &mut tokio::net::TcpStream) -> Option<(String, Vec<u8>)> {
    let mut raw = Vec::new();
    let mut buf = [0u8; 8192];
    let header_end = loop {
        let n = stream.read(&mut buf).await.ok()?;
        if n == 0 {
            return None;
        }
        raw.extend_from_slice(&buf[..n]);
        if let Some(at) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
    };
    let head = String::from_utf8_lossy(&raw[..header_end]).to_string();
    let length: usize = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length:")
                .map(|v| v.trim().parse().unwrap_or(0))
        })
        .unwrap_or(0);
    while raw.len() < header_end + length {
        let n = stream.read(&mut buf).await.ok()?;
        if n == 0 {
            return None;
        }
        raw.extend_from_slice(&buf[..n]);
    }
    stream
        .write_all(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\n\r\n",
        )
        .await
        .ok()?;
    Some((head, raw[header_end..header_end + length].to_vec()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn go_tracing_variables_send_otlp_over_http() {
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use prost::Message;

    let collector = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let collector_addr = collector.local_addr().unwrap();
    let (bodies_tx, mut bodies) = tokio::sync::mpsc::unbounded_channel();
    let receiver = tokio::spawn(async move {
        while let Ok((mut stream, _)) = collector.accept().await {
            let tx = bodies_tx.clone();
            tokio::spawn(async move {
                while let Some(request) = receive_post(&mut stream).await {
                    let _ = tx.send(request);
                }
            });
        }
    });

    let root = config_tree();
    let mut envs = go_env(root.path());
    envs.extend([
        // No Redis here: the call is answered by the failure mode, which is traced too.
        ("REDIS_SOCKET_TYPE", "tcp".into()),
        ("REDIS_URL", format!("127.0.0.1:{}", free_port())),
        ("TRACING_ENABLED", "true".into()),
        ("TRACING_SERVICE_NAMESPACE", "edge".into()),
        ("TRACING_SERVICE_INSTANCE_ID", "pod-1".into()),
        (
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            format!("http://{collector_addr}"),
        ),
        ("OTEL_BSP_SCHEDULE_DELAY", "100".into()),
    ]);
    let server = ServeProcess::spawn_as_ratelimit(&envs);
    let mut client = RateLimitServiceClient::connect(server.grpc_url())
        .await
        .unwrap();
    let _ = client
        .should_rate_limit(request("edge", &[&[("user", "traced")]]))
        .await;

    let (head, body) = tokio::time::timeout(Duration::from_secs(10), bodies.recv())
        .await
        .unwrap_or_else(|_| panic!("no OTLP request within 10 s:\n{}", server.log()))
        .expect("collector alive");
    assert!(head.starts_with("POST /v1/traces "), "{head}");
    assert!(
        head.to_ascii_lowercase().contains("application/x-protobuf"),
        "{head}"
    );
    let export = ExportTraceServiceRequest::decode(body.as_slice()).expect("OTLP protobuf");
    let resource = export.resource_spans[0].resource.clone().expect("resource");
    let attribute = |key: &str| {
        resource
            .attributes
            .iter()
            .find(|a| a.key == key)
            .and_then(|a| a.value.clone())
            .map(|v| format!("{:?}", v.value))
            .unwrap_or_default()
    };
    // The Go service's defaults and variables name the service.
    assert!(
        attribute("service.name").contains("\"RateLimit\""),
        "{resource:?}"
    );
    assert!(
        attribute("service.namespace").contains("\"edge\""),
        "{resource:?}"
    );
    assert!(
        attribute("service.instance.id").contains("\"pod-1\""),
        "{resource:?}"
    );
    let spans: Vec<&str> = export
        .resource_spans
        .iter()
        .flat_map(|r| &r.scope_spans)
        .flat_map(|s| &s.spans)
        .map(|s| s.name.as_str())
        .collect();
    assert!(spans.contains(&"should_rate_limit"), "{spans:?}");
    receiver.abort();
}
