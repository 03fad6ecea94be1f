//! Health and readiness: the admin endpoints (`/healthz`, `/readyz`, `/rlconfig`, `/json`), an
//! unreachable store reported (failing readiness only when asked to), a replica with no domain.

use crate::common;

use std::time::Duration;

use crate::common::TestServer;

use crate::common::http_at as http;

use crate::common::admin_addr as admin;

#[tokio::test]
async fn health_readiness_rlconfig_and_json() {
    let server = TestServer::start_with(&[("m.yaml", common::OPERATIONS_RULES)], |s| {
        s.admin_json = true
    })
    .await;
    let addr = admin(&server);
    assert_eq!(
        http(addr, "GET", "/healthz", "").await,
        (200, "ok\n".into())
    );
    let (status, body) = http(addr, "GET", "/readyz", "").await;
    assert_eq!(status, 200);
    assert!(
        body.contains("5 rule(s) from 1 file(s)") && body.contains("store: memory ok"),
        "{body}"
    );

    let (_, config) = http(addr, "GET", "/rlconfig", "").await;
    assert!(
        config.contains("m.path_/api/*: 10 per hour, token_bucket, burst 10"),
        "{config}"
    );
    assert!(
        config.contains("m.trial: 1 per hour, sliding_window, shadow_mode"),
        "{config}"
    );

    let call =
        r#"{"domain":"m","descriptors":[{"entries":[{"key":"user","value":"j"}]}],"hitsAddend":3}"#;
    let (status, body) = http(addr, "POST", "/json", call).await;
    assert_eq!(status, 200, "{body}");
    let parsed: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(parsed["overallCode"], "OK");
    assert_eq!(parsed["statuses"][0]["limitRemaining"], 1);
    assert_eq!(parsed["statuses"][0]["currentLimit"]["unit"], "HOUR");
    // snake_case names and a string uint64 (proto3 JSON) are accepted too.
    let call = r#"{"domain":"m","descriptors":[{"entries":[{"key":"user","value":"j"}],"hits_addend":"2"}]}"#;
    let (status, body) = http(addr, "POST", "/json", call).await;
    assert_eq!(status, 429, "{body}");
    assert!(body.contains(r#""overallCode":"OVER_LIMIT""#), "{body}");
    for bad in [
        "not json",
        r#"{"domain":"","descriptors":[{"entries":[{"key":"k"}]}]}"#,
        r#"{"domain":"m","bogus":1}"#,
    ] {
        let (status, body) = http(addr, "POST", "/json", bad).await;
        assert_eq!(status, 400, "{bad}: {body}");
        assert!(body.contains("error"), "{body}");
    }
    server.stop().await;
}

#[tokio::test]
async fn readiness_reports_an_unreachable_store_and_fails_only_when_asked_to() {
    let port = common::redis::free_port();
    for requires in [false, true] {
        let server = TestServer::start_with(&[("m.yaml", common::OPERATIONS_RULES)], |s| {
            s.store = portcullis::settings::StoreKind::Redis;
            s.redis_url = Some(format!("redis://127.0.0.1:{port}"));
            s.store_timeout = Duration::from_millis(200);
            s.ready_requires_store = requires;
        })
        .await;
        let (status, body) = http(admin(&server), "GET", "/readyz", "").await;
        assert!(
            body.contains("store: redis failing: store unavailable"),
            "{body}"
        );
        assert!(
            body.to_lowercase().contains("refused"),
            "the reason is given: {body}"
        );
        assert_eq!(status, if requires { 503 } else { 200 }, "{body}");
        // Liveness never depends on the store.
        assert_eq!(http(admin(&server), "GET", "/healthz", "").await.0, 200);
        server.stop().await;
    }
}
