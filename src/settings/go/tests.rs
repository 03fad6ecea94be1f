//! Go mode's reading of the Go service's variables.

use super::*;
use std::net::SocketAddr;
use std::path::PathBuf;

use crate::algorithm::Algorithm;
use crate::limiter::FailureMode;

fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let map: std::collections::HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |name| map.get(name).cloned()
}

fn base() -> Settings {
    Settings::for_tests(PathBuf::from("/unused"))
}

#[test]
fn go_durations_parse_as_go_parses_them() {
    assert_eq!(parse_go_duration("10s"), Some(Duration::from_secs(10)));
    assert_eq!(parse_go_duration("1m30s"), Some(Duration::from_secs(90)));
    assert_eq!(parse_go_duration("250ms"), Some(Duration::from_millis(250)));
    assert_eq!(parse_go_duration("24h"), Some(Duration::from_secs(86_400)));
    assert_eq!(parse_go_duration("1.5h"), Some(Duration::from_secs(5400)));
    assert_eq!(parse_go_duration("0"), Some(Duration::ZERO));
    assert_eq!(parse_go_duration("10"), None);
    assert_eq!(parse_go_duration("ten s"), None);
}

#[test]
fn the_go_defaults_and_redis_url_forms() {
    let s = from_go_env(base(), &env(&[])).unwrap();
    assert_eq!(s.grpc_addr, "0.0.0.0:8081".parse().unwrap());
    assert_eq!(s.admin_addr, "0.0.0.0:6070".parse().unwrap());
    assert_eq!(
        s.http_listeners[0].addr,
        "0.0.0.0:8080".parse::<SocketAddr>().unwrap()
    );
    assert_eq!(s.config, PathBuf::from("/srv/runtime_data/current/config"));
    assert_eq!(
        s.redis_url.as_deref(),
        Some("redis+unix:///var/run/nutcracker/ratelimit.sock")
    );
    assert_eq!(s.statsd_addr.as_deref(), Some("localhost:8125"));
    assert_eq!(s.default_algorithm, Algorithm::FixedWindow);
    assert_eq!(s.failure_mode, FailureMode::Error);
    assert_eq!(s.redis_pool_size, 10);
    assert_eq!(s.store_timeout, base().store_timeout);

    let s = from_go_env(base(), &env(&[("EXTRA_TAGS", "release:v1,zone:eu")])).unwrap();
    assert_eq!(
        s.statsd_tags,
        [
            ("release".into(), "v1".into()),
            ("zone".into(), "eu".into())
        ]
    );
    let Err(e) = from_go_env(base(), &env(&[("EXTRA_TAGS", "release:v1:x")])) else {
        panic!("a tag Go cannot read is refused");
    };
    assert!(e.to_string().contains("EXTRA_TAGS"), "{e}");

    // Go bounds each Redis command by REDIS_TIMEOUT: so does every decision.
    let s = from_go_env(base(), &env(&[("REDIS_TIMEOUT", "250ms")])).unwrap();
    assert_eq!(s.store_timeout, Duration::from_millis(250));
    assert_eq!(s.redis_connect_timeout, Duration::from_millis(250));

    let s = from_go_env(
        base(),
        &env(&[
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", "redis.internal:6379"),
            ("REDIS_TLS", "true"),
            ("REDIS_AUTH", "limiter:s3cret"),
            ("CACHE_KEY_PREFIX", "rl_"),
        ]),
    )
    .unwrap();
    assert_eq!(s.redis_url.as_deref(), Some("rediss://redis.internal:6379"));
    assert_eq!(s.redis_user.as_deref(), Some("limiter"));
    assert_eq!(s.redis_password.map(|p| p.0).as_deref(), Some("s3cret"));
    assert_eq!(s.key_prefix, "rl_");

    let s = from_go_env(
        base(),
        &env(&[
            ("REDIS_TYPE", "sentinel"),
            ("REDIS_URL", "mymaster,10.0.0.1:26379,10.0.0.2:26379"),
            ("REDIS_SENTINEL_AUTH", "sentinel-pass"),
        ]),
    )
    .unwrap();
    assert_eq!(s.redis_master.as_deref(), Some("mymaster"));
    assert_eq!(s.redis_sentinel, vec!["10.0.0.1:26379", "10.0.0.2:26379"]);
    assert_eq!(
        s.redis_sentinel_password.map(|p| p.0).as_deref(),
        Some("sentinel-pass")
    );

    let s = from_go_env(
        base(),
        &env(&[("REDIS_TYPE", "CLUSTER"), ("REDIS_URL", "a:7000,b:7001")]),
    )
    .unwrap();
    assert_eq!(s.redis_cluster, vec!["a:7000", "b:7001"]);

    // host:port with the unix socket type (Go's default) would dial a socket by that name.
    let Err(e) = from_go_env(base(), &env(&[("REDIS_URL", "redis:6379")])) else {
        panic!("a TCP address on a unix socket type is refused");
    };
    let e = e.to_string();
    assert!(e.contains("REDIS_SOCKET_TYPE is unset"), "{e}");
    assert!(e.contains("REDIS_SOCKET_TYPE=tcp"), "{e}");
}

#[test]
fn envoy_gateways_environment_takes_rules_over_xds() {
    // What Envoy Gateway sets on the rate-limit Deployment it manages.
    let s = from_go_env(
        base(),
        &env(&[
            ("RUNTIME_ROOT", "/data"),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("RUNTIME_IGNOREDOTFILES", "true"),
            ("RUNTIME_WATCH_ROOT", "false"),
            ("LOG_LEVEL", "info"),
            ("USE_STATSD", "true"),
            ("STATSD_PORT", "9125"),
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
            ("CONFIG_GRPC_XDS_SERVER_URL", "envoy-gateway:18001"),
            ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit"),
            ("GRPC_SERVER_USE_TLS", "true"),
            ("GRPC_SERVER_TLS_CERT", "/certs/tls.crt"),
            ("GRPC_SERVER_TLS_KEY", "/certs/tls.key"),
            ("GRPC_SERVER_TLS_CA_CERT", "/certs/ca.crt"),
            ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "/certs/tls.crt"),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "/certs/tls.key"),
            ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/certs/ca.crt"),
            ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", "redis.redis.svc:6379"),
        ]),
    )
    .unwrap();
    assert_eq!(
        s.xds.rules_xds_server.as_deref(),
        Some("envoy-gateway:18001")
    );
    assert_eq!(s.xds.rules_xds_node_id, "envoy-ratelimit");
    assert!(s.xds.rules_xds_tls && s.force_start_without_initial_rules);
    assert_eq!(
        s.xds.rules_xds_ca_file,
        Some(PathBuf::from("/certs/ca.crt"))
    );
    assert_eq!(s.xds.rules_xds_cert, Some(PathBuf::from("/certs/tls.crt")));
    assert_eq!(s.xds.rules_xds_backoff_initial, Duration::from_secs(10));
    assert_eq!(s.grpc_tls_cert, Some(PathBuf::from("/certs/tls.crt")));
    // The Go service reads no GRPC_SERVER_TLS_CA_CERT: clients are not asked for certificates.
    assert_eq!(s.grpc_tls_client_ca, None);
    assert_eq!(s.redis_url.as_deref(), Some("redis://redis.redis.svc:6379"));
    assert_eq!(s.statsd_addr.as_deref(), Some("localhost:9125"));
    let ignored = s.ignored_variables.join("\n");
    for name in [
        "RUNTIME_IGNOREDOTFILES",
        "RUNTIME_WATCH_ROOT",
        "GRPC_SERVER_TLS_CA_CERT",
    ] {
        assert!(ignored.contains(name), "{name} in {ignored}");
    }
    assert!(s.validate().is_ok());
}

#[test]
fn portcullis_own_choice_of_algorithm_and_failure_mode_wins_where_set() {
    let mut own = base();
    own.default_algorithm = Algorithm::SlidingWindow;
    own.failure_mode = FailureMode::Local;
    let s = from_go_env(
        own,
        &env(&[
            ("PORTCULLIS_DEFAULT_ALGORITHM", "sliding-window"),
            ("PORTCULLIS_FAILURE_MODE", "local"),
        ]),
    )
    .unwrap();
    assert_eq!(s.default_algorithm, Algorithm::SlidingWindow);
    assert_eq!(s.failure_mode, FailureMode::Local);
    assert_eq!(s.override_algorithm, Algorithm::FixedWindow);
}

#[test]
fn what_cannot_be_honoured_stops_the_start_naming_the_variable() {
    let Err(e) = from_go_env(
        base(),
        &env(&[
            ("BACKEND_TYPE", "memcache"),
            ("REDIS_PERSECOND", "true"),
            ("REDIS_PERSECOND_TYPE", "RING"),
        ]),
    ) else {
        panic!("refused");
    };
    let text = e.to_string();
    assert!(
        text.contains("BACKEND_TYPE") && text.contains("REDIS_PERSECOND_TYPE"),
        "{text}"
    );
    // The per-second Redis is read from its own variables.
    let s = from_go_env(
        base(),
        &env(&[
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", "main:6379"),
            ("REDIS_PERSECOND", "true"),
            ("REDIS_PERSECOND_TYPE", "cluster"),
            ("REDIS_PERSECOND_URL", "a:7000,b:7001"),
            ("REDIS_PERSECOND_AUTH", "fast:pw"),
            ("REDIS_TIMEOUT", "300ms"),
        ]),
    )
    .unwrap();
    let fast = s.redis_per_second.expect("a per-second Redis");
    // REDIS_TIMEOUT bounds the per-second Redis' connections and calls too.
    assert_eq!(fast.redis_connect_timeout, Duration::from_millis(300));
    assert_eq!(fast.store_timeout, Duration::from_millis(300));
    assert_eq!(s.redis_url.as_deref(), Some("redis://main:6379"));
    assert_eq!(fast.redis_cluster, vec!["a:7000", "b:7001"]);
    assert_eq!(fast.redis_user.as_deref(), Some("fast"));
    assert!(fast.redis_url.is_none());
    let Err(e) = from_go_env(base(), &env(&[("SHADOW_MODE", "maybe")])) else {
        panic!("refused");
    };
    assert!(e.to_string().contains("SHADOW_MODE"), "{e}");
}
