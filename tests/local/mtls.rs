//! gRPC over mutual TLS, with certificates rotated without a restart.

use crate::common;

use std::time::{Duration, Instant};

use crate::common::request;
use portcullis::pb::rate_limit_response::Code;

const OK: i32 = Code::Ok as i32;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_over_mtls_with_certificates_rotated_without_a_restart() {
    use crate::common::tls::{make_ca, make_leaf};
    use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

    let certs = tempfile::tempdir().unwrap();
    let d = certs.path();
    for ca in ["ca1", "ca2", "clients"] {
        make_ca(d, ca);
    }
    make_leaf(d, "ca1", "server1");
    make_leaf(d, "ca2", "server2");
    make_leaf(d, "clients", "client");
    make_leaf(d, "ca1", "stranger");
    std::fs::copy(d.join("server1.crt"), d.join("tls.crt")).unwrap();
    std::fs::copy(d.join("server1.key"), d.join("tls.key")).unwrap();

    let rules = tempfile::tempdir().unwrap();
    std::fs::write(rules.path().join("m.yaml"), common::OPERATIONS_RULES).unwrap();
    let mut settings = portcullis::settings::Settings::for_tests(rules.path().to_path_buf());
    settings.grpc_tls_cert = Some(d.join("tls.crt"));
    settings.grpc_tls_key = Some(d.join("tls.key"));
    settings.grpc_tls_client_ca = Some(d.join("clients.crt"));
    let running = portcullis::server::start(
        &settings,
        std::sync::Arc::new(portcullis::clock::ManualClock::new(common::START_US)),
    )
    .await
    .expect("starts with TLS");
    let url = format!("https://127.0.0.1:{}", running.grpc_addr.port());
    let pem = |name: &str| std::fs::read(d.join(name)).unwrap();
    let call = |trust: &'static str, identity: Option<&'static str>| {
        let mut tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(pem(trust)))
            .domain_name("localhost");
        if let Some(id) = identity {
            tls = tls.identity(Identity::from_pem(
                pem(&format!("{id}.crt")),
                pem(&format!("{id}.key")),
            ));
        }
        let url = url.clone();
        async move {
            let channel = Channel::from_shared(url)
                .unwrap()
                .tls_config(tls)
                .unwrap()
                .connect()
                .await
                .map_err(|e| e.to_string())?;
            let mut client = portcullis::pb::RateLimitServiceClient::new(channel);
            client
                .should_rate_limit(request("m", &[&[("user", "tls")]]))
                .await
                .map(|r| r.into_inner().overall_code)
                .map_err(|e| e.to_string())
        }
    };
    assert_eq!(
        call("ca1.crt", Some("client")).await,
        Ok(OK),
        "mTLS with a client certificate"
    );
    assert!(
        call("ca1.crt", None).await.is_err(),
        "no client certificate: refused"
    );
    assert!(
        call("ca1.crt", Some("stranger")).await.is_err(),
        "a client certificate from another CA: refused"
    );
    assert!(
        call("ca2.crt", Some("client")).await.is_err(),
        "the server does not have the ca2 certificate yet"
    );

    // Rotation: new files on disk (a Kubernetes secret update); the new certificate is served.
    std::fs::copy(d.join("server2.key"), d.join("tls.key")).unwrap();
    std::fs::copy(d.join("server2.crt"), d.join("tls.crt")).unwrap();
    let start = Instant::now();
    while call("ca2.crt", Some("client")).await != Ok(OK) {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the rotated certificate was not picked up"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        call("ca1.crt", Some("client")).await.is_err(),
        "the old certificate is gone"
    );
    running.shutdown().await;
}
