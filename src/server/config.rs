//! The composition root's translations of `Settings` into each part's own configuration: the
//! xDS client's, the gRPC listener's TLS files, each Redis' (and the per-second one's). It must
//! never start anything: it only reads files named by flags and checks what it builds.

use std::sync::Arc;
use std::time::Duration;

use crate::service::quota::QuotaConfig;
use crate::telemetry::statsd_mapping::StatsdMapping;

use crate::settings::Settings;
use crate::store::redis::{RedisConfig, SentinelAuth, Topology};

use super::{StartError, tls, xds};

/// The xDS client's settings, checked (a bad header, CA file or address stops the start-up).
pub(super) fn xds_config(
    settings: &Settings,
    server: &str,
) -> Result<xds::XdsClientConfig, StartError> {
    let bad = |e: xds::XdsSettingError| StartError::Settings(e.to_string());
    let tls = if settings.xds.rules_xds_tls {
        let ca = settings.xds.rules_xds_ca_file.as_ref().ok_or_else(|| {
            StartError::Settings(
                "--rules-xds-tls needs --rules-xds-ca-file (CONFIG_GRPC_XDS_SERVER_TLS_CACERT): \
                 the xDS server's certificate is checked against that CA only"
                    .into(),
            )
        })?;
        let mut tls = tonic::transport::ClientTlsConfig::new().ca_certificate(
            tonic::transport::Certificate::from_pem(read_file("--rules-xds-ca-file", ca)?),
        );
        match (&settings.xds.rules_xds_cert, &settings.xds.rules_xds_key) {
            (Some(cert), Some(key)) => {
                tls = tls.identity(tonic::transport::Identity::from_pem(
                    read_file("--rules-xds-cert", cert)?,
                    read_file("--rules-xds-key", key)?,
                ));
            }
            (None, None) => {}
            _ => {
                return Err(StartError::Settings(
                    "--rules-xds-cert and --rules-xds-key go together".into(),
                ));
            }
        }
        if let Some(san) = &settings.xds.rules_xds_san {
            tls = tls.domain_name(san.clone());
        }
        Some(tls)
    } else {
        None
    };
    Ok(xds::XdsClientConfig {
        uri: xds::server_uri(server, settings.xds.rules_xds_tls).map_err(bad)?,
        node: xds::node(
            &settings.xds.rules_xds_node_id,
            settings.xds.rules_xds_node_metadata.as_deref(),
        )
        .map_err(bad)?,
        headers: xds::headers(settings.xds.rules_xds_headers.as_deref()).map_err(bad)?,
        tls,
        backoff: xds::Backoff {
            initial: settings.xds.rules_xds_backoff_initial,
            max: settings.xds.rules_xds_backoff_max,
            random_factor: settings.xds.rules_xds_backoff_random_factor,
            jitter: settings.xds.rules_xds_backoff_jitter,
        },
        max_message_bytes: settings.xds.rules_xds_max_message_bytes,
        connect_timeout: Duration::from_secs(10),
    })
}

/// The gRPC TLS files, when TLS is configured (a certificate needs its key).
pub(super) fn tls_files(settings: &Settings) -> Result<Option<tls::TlsFiles>, StartError> {
    match (&settings.grpc_tls_cert, &settings.grpc_tls_key) {
        (None, None) if settings.grpc_tls_client_ca.is_some() => Err(StartError::Settings(
            "--grpc-tls-client-ca needs --grpc-tls-cert and --grpc-tls-key".into(),
        )),
        (None, None) => Ok(None),
        (Some(cert), Some(key)) => Ok(Some(tls::TlsFiles {
            cert: cert.clone(),
            key: key.clone(),
            client_ca: settings.grpc_tls_client_ca.clone(),
            client_san: settings.grpc_tls_client_san.clone(),
        })),
        _ => Err(StartError::Settings(
            "--grpc-tls-cert and --grpc-tls-key go together".into(),
        )),
    }
}

/// The Redis connection settings, exactly one topology.
/// The settings of the per-second Redis, when there is one: Go mode's REDIS_PERSECOND_*, or
/// --redis-per-second-url with the other Redis settings shared.
pub(super) fn per_second_settings(settings: &Settings) -> Option<Settings> {
    if let Some(per_second) = &settings.redis_per_second {
        return Some(Settings::clone(per_second));
    }
    let url = settings.redis_per_second_url.clone()?;
    let mut per_second = settings.clone();
    per_second.redis_url = Some(url);
    per_second.redis_cluster = Vec::new();
    per_second.redis_sentinel = Vec::new();
    per_second.redis_per_second = None;
    Some(per_second)
}

pub(super) fn redis_config(settings: &Settings) -> Result<RedisConfig, StartError> {
    let topology = match (
        &settings.redis_url,
        settings.redis_cluster.is_empty(),
        settings.redis_sentinel.is_empty(),
    ) {
        (Some(url), true, true) => Topology::Standalone(url.clone()),
        (None, false, true) => Topology::Cluster(settings.redis_cluster.clone()),
        (None, true, false) => Topology::Sentinel {
            sentinels: settings.redis_sentinel.clone(),
            master: settings.redis_master.clone().ok_or_else(|| {
                StartError::Settings(
                    "--redis-sentinel needs --redis-master (the monitored master's name)".into(),
                )
            })?,
        },
        (None, true, true) => {
            return Err(StartError::Settings(
                "--store redis needs one of --redis-url, --redis-cluster, --redis-sentinel".into(),
            ));
        }
        _ => {
            return Err(StartError::Settings(
                "give only one of --redis-url, --redis-cluster, --redis-sentinel".into(),
            ));
        }
    };
    let ca_pem = match &settings.redis_ca_file {
        Some(path) => Some(read_file("--redis-ca-file", path)?),
        None => None,
    };
    if settings.redis_tls_skip_hostname_verification && !settings.redis_sentinel.is_empty() {
        return Err(StartError::Settings(
            "--redis-tls-skip-hostname-verification is not supported with Sentinel".into(),
        ));
    }
    let client_cert_pem = match (&settings.redis_tls_cert, &settings.redis_tls_key) {
        (Some(cert), Some(key)) => Some((
            read_file("--redis-tls-cert", cert)?,
            read_file("--redis-tls-key", key)?,
        )),
        (None, None) => None,
        _ => {
            return Err(StartError::Settings(
                "--redis-tls-cert and --redis-tls-key go together".into(),
            ));
        }
    };
    let sentinel_ca_pem = match &settings.redis_sentinel_ca_file {
        Some(path) => Some(read_file("--redis-sentinel-ca-file", path)?),
        None => None,
    };
    Ok(RedisConfig {
        topology,
        tls: settings.redis_tls || ca_pem.is_some() || client_cert_pem.is_some(),
        ca_pem,
        client_cert_pem,
        skip_hostname_verification: settings.redis_tls_skip_hostname_verification,
        username: settings.redis_user.clone(),
        password: settings.redis_password.as_ref().map(|s| s.0.clone()),
        sentinel: SentinelAuth {
            tls: settings.redis_sentinel_tls || sentinel_ca_pem.is_some(),
            ca_pem: sentinel_ca_pem,
            username: settings.redis_sentinel_user.clone(),
            password: settings
                .redis_sentinel_password
                .as_ref()
                .map(|s| s.0.clone()),
        },
        pool_size: settings.redis_pool_size,
        connect_timeout: settings.redis_connect_timeout,
        wait_replicas: settings.redis_wait_replicas,
    })
}

pub(super) fn read_file(flag: &str, path: &std::path::Path) -> Result<Vec<u8>, StartError> {
    std::fs::read(path)
        .map_err(|e| StartError::Settings(format!("cannot read {flag} {}: {e}", path.display())))
}

/// A custom statsd_exporter mapping for the Go-named series: read now, refused whole.
pub(super) fn go_mapping(settings: &Settings) -> Result<Option<Arc<StatsdMapping>>, StartError> {
    Ok(match &settings.go_metrics_mapping {
        None => None,
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| {
                StartError::Settings(format!(
                    "the statsd_exporter mapping {} cannot be read: {e}",
                    path.display()
                ))
            })?;
            let mapping = StatsdMapping::parse(&text).map_err(|e| {
                StartError::Settings(format!(
                    "the statsd_exporter mapping {} is refused: {e}",
                    path.display()
                ))
            })?;
            Some(Arc::new(mapping))
        }
    })
}

/// The quota service's bounds and timing (`--rlqs-*`, the request bounds, the failure mode).
pub(super) fn quota_config(settings: &Settings) -> QuotaConfig {
    QuotaConfig {
        reporting_interval: settings.rlqs.rlqs_reporting_interval,
        max_streams: settings.rlqs.rlqs_max_streams,
        max_buckets_per_stream: settings.rlqs.rlqs_max_buckets_per_stream,
        max_bucket_bytes_per_stream: settings.rlqs.rlqs_max_bucket_bytes_per_stream,
        max_bucket_bytes: settings.rlqs.rlqs_max_bucket_bytes,
        max_reports_per_second: settings.rlqs.rlqs_max_reports_per_second,
        max_entries: settings.max_entries,
        max_string_bytes: settings.max_string_bytes,
        failure_mode: settings.failure_mode,
        store_timeout: settings.rlqs.rlqs_store_timeout,
        burst: settings.rlqs.rlqs_burst,
        push_every: (!settings.rlqs.rlqs_push_interval.is_zero())
            .then_some(settings.rlqs.rlqs_push_interval),
    }
}
