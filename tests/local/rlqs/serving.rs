//! Around the stream: the admin listener's view, a reload removing a rule, TLS.

use super::*;

#[tokio::test]
async fn the_admin_listener_shows_each_stream_its_buckets_and_what_they_were_assigned() {
    let server = server().await;
    let admin = server.running.as_ref().unwrap().admin_addr.port();
    let mut gateway = Gateway::open(&server).await;
    gateway
        .report(
            "edge",
            &[(&[("tenant", "a")], 30, 0), (&[("colour", "blue")], 1, 0)],
        )
        .await
        .unwrap();
    let (status, body) = common::http(admin, "GET", "/rlqs", "").await;
    assert_eq!(status, 200, "{body}");
    let doc: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(doc["buckets"], 2, "{doc:#}");
    let buckets = doc["streams"][0]["buckets"].as_array().unwrap();
    let tenant = buckets
        .iter()
        .find(|b| b["bucket"]["tenant"] == "a")
        .expect("the tenant bucket");
    assert_eq!(tenant["rule"], "edge.tenant");
    assert_eq!(tenant["assignment"], "token_bucket 10/1s");
    let colour = buckets
        .iter()
        .find(|b| b["bucket"]["colour"] == "blue")
        .expect("the other");
    assert_eq!(colour["assignment"], "allow_all");
    assert!(colour["rule"].is_null());
    let metrics = server.running.as_ref().unwrap().metrics.encode();
    assert!(metrics.contains("portcullis_rlqs_buckets 2"), "{metrics}");
    for series in ["rlqs_rule_buckets", "rlqs_rule_streams"] {
        let line = format!("portcullis_{series}{{domain=\"edge\",rule=\"edge.tenant\"}} 1");
        assert!(metrics.contains(&line), "{line}\n{metrics}");
    }
    assert!(
        metrics.contains("portcullis_rlqs_granted_rate{domain=\"edge\",rule=\"edge.tenant\"} 10.0"),
        "{metrics}"
    );
    // The gateway goes away: its buckets leave the listing and the gauges.
    drop(gateway);
    let started = std::time::Instant::now();
    loop {
        let (_, body) = common::http(admin, "GET", "/rlqs", "").await;
        if body.contains("\"buckets\":0") {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "never forgotten: {body}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let metrics = server.running.as_ref().unwrap().metrics.encode();
    assert!(metrics.contains("portcullis_rlqs_buckets 0"), "{metrics}");
    assert!(
        metrics.contains("portcullis_rlqs_granted_rate{domain=\"edge\",rule=\"edge.tenant\"} 0.0"),
        "{metrics}"
    );
    server.stop().await;
}

/// A reload that removes a rule: its buckets are abandoned at their next report (Envoy forgets
/// them); a bucket that never met a rule stays allowed.
#[tokio::test]
async fn a_rule_removed_by_a_reload_abandons_its_buckets() {
    let server = server().await;
    let mut gateway = Gateway::open(&server).await;
    let usages: &[Usage<'_>] = &[(&[("tenant", "a")], 1, 0), (&[("colour", "red")], 1, 0)];
    let actions = gateway.report("edge", usages).await.unwrap();
    assert!(assigned(&actions[0]).starts_with("tokens"), "{actions:?}");
    let without_tenant = RULES.replace(
        "  - key: tenant\n    rate_limit: {unit: second, requests_per_unit: 10}\n",
        "",
    );
    assert_ne!(without_tenant, RULES);
    let staged = server.dir.path().join(".edge.yaml.new");
    std::fs::write(&staged, without_tenant).unwrap();
    std::fs::rename(&staged, server.dir.path().join("edge.yaml")).unwrap();
    // The reload lands within a poll (100 ms here): report until it shows (bounded).
    let started = std::time::Instant::now();
    let words = loop {
        let actions = gateway.report("edge", usages).await.unwrap();
        let words: Vec<String> = actions.iter().map(assigned).collect();
        if !words[0].starts_with("tokens") {
            break words;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "never reloaded: {words:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(words, ["abandon", "allow_all ttl 3s"]);
    // Abandoned, the bucket is forgotten: reported again, it is new and meets no rule.
    let actions = gateway.report("edge", usages).await.unwrap();
    assert_eq!(assigned(&actions[0]), "allow_all ttl 3s");
    server.stop().await;
}

/// RLQS is served on the TLS listener too (the same gRPC server as RLS).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rlqs_is_served_over_tls() {
    use common::tls::{make_ca, make_leaf};
    use tonic::transport::{Certificate, Channel, ClientTlsConfig};
    let certs = tempfile::tempdir().unwrap();
    let d = certs.path();
    make_ca(d, "ca");
    make_leaf(d, "ca", "server");
    let server = TestServer::start_with(&[("edge.yaml", RULES)], |s| {
        s.rlqs.rlqs = true;
        s.rlqs.rlqs_reporting_interval = Duration::from_secs(1);
        s.grpc_tls_cert = Some(d.join("server.crt"));
        s.grpc_tls_key = Some(d.join("server.key"));
    })
    .await;
    let port = server.running.as_ref().unwrap().grpc_addr.port();
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(
            std::fs::read(d.join("ca.crt")).unwrap(),
        ))
        .domain_name("localhost");
    let channel = Channel::from_shared(format!("https://127.0.0.1:{port}"))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .expect("TLS connects");
    let mut gateway = Gateway::over(channel).await;
    let actions = gateway
        .report("edge", &[(&[("tenant", "a")], 1, 0)])
        .await
        .unwrap();
    assert_eq!(assigned(&actions[0]), "tokens 10/1s max 2 ttl 3s");
    server.stop().await;
}
