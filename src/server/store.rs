//! The store and the policy over it, as the settings ask: the memory store (the embedded
//! default), or Redis (one, or two with per-second limits apart) with the `local` failure mode's
//! memory store beside it. It must never let a full memory store answer other than by the
//! failure mode chosen.

use std::sync::Arc;
use std::time::Duration;

use crate::clock::Clock;
use crate::limiter::{DenyCacheBounds, FailureMode, Limiter, LimiterConfig};
use crate::settings::{Settings, StoreKind};
use crate::store::hot::{HotConfig, HotStore};
use crate::store::quota::{MemoryClaims, MemoryQuota, QuotaStore, RlsTally};
use crate::store::split::SplitStore;
use crate::store::{MemoryStore, RedisStore, Store};
use crate::telemetry::Metrics;

use super::StartError;
use super::config::{per_second_settings, redis_config};

/// Where RLQS grants live.
pub(super) struct Quota {
    pub store: Arc<dyn QuotaStore>,
    /// Under `--failure-mode local` on Redis: this replica's own grants while Redis is away
    /// (RLS, counting locally then too, counts their claims).
    pub fallback: Option<Arc<MemoryQuota>>,
    /// The RLS hits the stores tallied on claimed descriptors (`demand::spawn`).
    pub tally: Arc<RlsTally>,
    /// Hot counters decided from this replica's claims, when `--hot-descriptor-rate` is set:
    /// its sweeper gives back what they leave unspent.
    pub hot: Option<HotStore>,
}

/// The limiter over the store the settings name, and where RLQS grants live: the same Redis
/// (every replica shares them; its RLS checks count their claims in the script), or this
/// replica's memory. Every store the limiter counts in counts the claims.
pub(super) fn limiter(
    settings: &Settings,
    clock: &Arc<dyn Clock>,
    metrics: &Arc<Metrics>,
) -> Result<(Limiter, Quota), StartError> {
    // Every replica's RLS checks count the gateways' claims, serving RLQS or not (a gateway on
    // another replica may hold part of a rule), the Go drop-in mode's too: the Go service has no
    // RLQS, but a replica in its mode may share a Redis with replicas that serve it (a
    // migration), and where none does it pays one look a second.
    let tally = Arc::new(RlsTally::default());
    let mut hot_store = None;
    // A memory store's RLS checks count the claims of `quota` (this replica's grants).
    let memory = |quota: Option<&Arc<MemoryQuota>>| {
        let store = MemoryStore::with_max_counters(clock.clone(), settings.memory_max_counters);
        if let Some(quota) = quota {
            store.count_claims(MemoryClaims {
                quota: quota.clone(),
                tally: tally.clone(),
            });
            quota.read_windows_from(&store);
        }
        store.spawn_sweeper(Duration::from_secs(10));
        let held = Arc::downgrade(&store);
        metrics.watch_memory_fill(Box::new(move || {
            held.upgrade().map_or(0.0, |store| store.fill_ratio())
        }));
        Box::new(store)
    };
    let limiter = match settings.store {
        // The memory store fails only when full: a new descriptor is then answered by the
        // failure mode chosen (never a silent allow under `deny`). `local` has nothing more local
        // to count in, so it refuses, like `deny`.
        StoreKind::Memory => {
            let failure_mode = match settings.failure_mode {
                FailureMode::Local => FailureMode::Deny,
                mode => mode,
            };
            let config = LimiterConfig {
                deadline: Duration::from_secs(3600),
                failure_mode,
                deny_cache: None,
            };
            let quota = Arc::new(MemoryQuota::new(clock.clone()));
            (
                Limiter::with_policy(memory(Some(&quota)), config, None, metrics.clone()),
                Quota {
                    store: quota,
                    fallback: None,
                    tally: tally.clone(),
                    hot: None,
                },
            )
        }
        StoreKind::Redis => {
            let config = redis_config(settings)?;
            tracing::info!(redis = ?config, prefix = %settings.key_prefix, "using Redis");
            let store = RedisStore::new(&config, &settings.key_prefix, metrics.clone())
                .map_err(|e| StartError::Settings(e.to_string()))?
                .with_layout(settings.redis_layout);
            spawn_probe(store.clone(), settings.redis_connect_timeout * 2);
            store.count_claims(tally.clone(), settings.rlqs.rlqs);
            let own_grants = (settings.failure_mode == FailureMode::Local)
                .then(|| Arc::new(MemoryQuota::new(clock.clone())));
            let mut quota = Quota {
                store: Arc::new(store.clone()),
                fallback: own_grants.clone(),
                tally: tally.clone(),
                hot: None,
            };
            let store: Box<dyn Store> = match per_second_settings(settings) {
                None => Box::new(store),
                Some(per_second) => {
                    let config = redis_config(&per_second)?;
                    tracing::info!(redis = ?config, "per-second limits in their own Redis");
                    let fast = RedisStore::new(&config, &settings.key_prefix, metrics.clone())
                        .map(|s| s.with_layout(settings.redis_layout))
                        .map_err(|e| StartError::Settings(e.to_string()))?;
                    spawn_probe(fast.clone(), settings.redis_connect_timeout * 2);
                    Box::new(SplitStore::new(Box::new(store), Box::new(fast)))
                }
            };
            // Hot counters decided from this replica's claims in them (`store::hot`).
            let store: Box<dyn Store> = if settings.hot_descriptor_rate > 0.0 {
                let hot = HotStore::new(
                    Arc::from(store),
                    Arc::new(crate::clock::SystemClock::default()),
                    HotConfig {
                        rate: settings.hot_descriptor_rate,
                        store_timeout: settings.store_timeout,
                    },
                    Some(tally.clone()),
                    metrics.hot.clone(),
                );
                hot_store = Some(hot.clone());
                Box::new(hot)
            } else {
                store
            };
            let fallback = (settings.failure_mode == FailureMode::Local)
                .then(|| memory(own_grants.as_ref()) as Box<dyn Store>);
            let config = LimiterConfig {
                deadline: settings.store_timeout,
                failure_mode: settings.failure_mode,
                deny_cache: settings.deny_cache.then_some(DenyCacheBounds {
                    max_entries: settings.deny_cache_max_entries,
                    max_bytes: settings.deny_cache_max_bytes,
                    max_age: settings.deny_cache_max_age,
                }),
            };
            quota.hot = hot_store;
            (
                Limiter::with_policy(store, config, fallback, metrics.clone())
                    .with_tally(Some(tally.clone())),
                quota,
            )
        }
    };
    Ok(limiter)
}

/// Tells at start-up, in the log, whether Redis is usable and if not why (the connections keep
/// trying in the background either way).
fn spawn_probe(store: RedisStore, timeout: Duration) {
    tokio::spawn(async move {
        match store.probe(timeout).await {
            Ok(what) => tracing::info!("Redis ready: {what}"),
            Err(e) if e.is_permanent() => tracing::error!(
                error = %e,
                "Redis refuses Portcullis: every call is answered by the failure mode until this is fixed"
            ),
            Err(e) => tracing::warn!(
                error = %e,
                "Redis not usable yet: calls are answered by the failure mode meanwhile; still trying"
            ),
        }
    });
}
