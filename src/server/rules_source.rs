//! Where the rules come from at start: the rules directory (loaded now; a broken set stops the
//! start), or an xDS server (its client started, and, unless told to start without rules, the
//! start held until a first valid set arrives). It must never serve with half a set.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::task::JoinHandle;

use crate::rules::{self, Snapshot};
use crate::settings::Settings;
use crate::telemetry::Metrics;

use super::config::xds_config;
use super::waiting::Waiting;
use super::{StartError, xds};

/// The rules in force, the fingerprint of what was loaded, and whether they come over xDS.
pub(super) async fn start(
    settings: &Settings,
    metrics: &Arc<Metrics>,
    stopped: &tokio::sync::watch::Receiver<bool>,
    tasks: &mut Vec<JoinHandle<()>>,
    http_listeners: &[&tokio::net::TcpListener],
) -> Result<(Arc<ArcSwap<Snapshot>>, u64, bool), StartError> {
    let (snapshot, xds) = match &settings.xds.rules_xds_server {
        None => {
            let snapshot =
                rules::load_dir(&settings.config, settings.load_options()).map_err(|source| {
                    StartError::Rules {
                        dir: settings.config.display().to_string(),
                        source,
                    }
                })?;
            if let Some(why) = rules::why_empty(&settings.config, &snapshot) {
                if !settings.allow_empty_rules {
                    return Err(StartError::Settings(settings.sources.spell(&format!(
                        "{why}; set --allow-empty-rules to start so on purpose"
                    ))));
                }
                tracing::warn!(dir = %settings.config.display(), "{why}");
            }
            tracing::info!(
                files = snapshot.files.len(),
                domains = ?snapshot.domain_names(),
                "rules loaded"
            );
            metrics.rules_loaded(snapshot.loaded_at);
            // The first load is a load, as the Go service's config_load_success counts it.
            metrics
                .rules_reloads
                .get_or_create(&crate::telemetry::ResultLabels {
                    result: "success".into(),
                })
                .inc();
            (snapshot, None)
        }
        Some(server) => (
            rules::Snapshot::empty(),
            Some(xds_config(settings, server)?),
        ),
    };
    let loaded_fingerprint = snapshot.fingerprint;
    let rules = Arc::new(ArcSwap::from_pointee(snapshot));
    let from_xds = xds.is_some();
    if let Some(config) = xds {
        let (task, applied) = xds::spawn(
            xds::XdsRules {
                config,
                rules: rules.clone(),
                metrics: metrics.clone(),
                options: settings.load_options(),
            },
            stopped.clone(),
        );
        tasks.push(task);
        if !settings.force_start_without_initial_rules {
            // Alive meanwhile: a liveness probe must not kill a pod whose control plane is slow.
            let server = settings.xds.rules_xds_server.as_deref().unwrap_or_default();
            let waiting = Waiting::serve(
                http_listeners,
                format!("waiting for the first rules from the xDS server {server}"),
                metrics,
            )
            .map_err(|e| StartError::Settings(format!("cannot serve while waiting: {e}")))?;
            let waited = wait_for_first_rules(applied, &settings.xds.rules_xds_server).await;
            waiting.end().await;
            waited?;
        }
    }
    Ok((rules, loaded_fingerprint, from_xds))
}

/// Holds the start-up until the xDS server has delivered a valid set (as the Go service does
/// without FORCE_START_WITHOUT_INITIAL_CONFIG), saying so every 30 s.
async fn wait_for_first_rules(
    mut applied: tokio::sync::watch::Receiver<bool>,
    server: &Option<String>,
) -> Result<(), StartError> {
    let server = server.as_deref().unwrap_or_default();
    tracing::info!(
        %server,
        "waiting for the first rules from the xDS server before serving \
         (--force-start-without-initial-rules serves at once)"
    );
    let mut waited = Duration::ZERO;
    loop {
        match tokio::time::timeout(Duration::from_secs(30), applied.wait_for(|a| *a)).await {
            Ok(Ok(_)) => return Ok(()),
            Ok(Err(_)) => {
                return Err(StartError::Settings(
                    "the xDS rules client stopped before delivering rules".into(),
                ));
            }
            Err(_) => {
                waited += Duration::from_secs(30);
                tracing::warn!(%server, ?waited, "still waiting for the first xDS rules");
            }
        }
    }
}
