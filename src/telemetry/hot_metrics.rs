//! The series of hot counters decided in the replica (`store::hot`): calls answered from a
//! claim, claims taken, refused and failed, and what became of the claimed hits. Labels are
//! fixed words, never a counter's values.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::register::register;

#[derive(Default)]
pub struct HotMetrics {
    /// Checks answered from this replica's claims (no store call).
    pub decisions: Counter,
    pub claims_taken: Counter,
    /// Takes the store refused (the counter had not that much left).
    pub claims_refused: Counter,
    /// Takes that failed (the store unreachable or late).
    pub claims_failed: Counter,
    pub claimed_hits: Counter,
    /// Claimed hits given back unspent (the counter went quiet, shutdown).
    pub given_back_hits: Counter,
    /// Claimed hits left unspent when their period ended (counted in the store, never admitted).
    pub lapsed_hits: Counter,
    /// Counters this replica follows (their rate, and their claims).
    pub descriptors: Gauge,
}

impl HotMetrics {
    pub(super) fn register(&self, registry: &mut Registry, names: &mut Vec<String>) {
        register(
            registry,
            names,
            "hot_decisions",
            "Checks on hot counters answered from this replica's claims, without a store call",
            self.decisions.clone(),
        );
        register(
            registry,
            names,
            "hot_claims_taken",
            "Claims taken on hot counters (hits charged in the store ahead of their calls)",
            self.claims_taken.clone(),
        );
        register(
            registry,
            names,
            "hot_claims_refused",
            "Claims the store refused: the counter had not that much left",
            self.claims_refused.clone(),
        );
        register(
            registry,
            names,
            "hot_claims_failed",
            "Claims that could not be taken: the store failed or was late",
            self.claims_failed.clone(),
        );
        register(
            registry,
            names,
            "hot_claimed_hits",
            "Hits claimed on hot counters",
            self.claimed_hits.clone(),
        );
        register(
            registry,
            names,
            "hot_given_back_hits",
            "Claimed hits given back unspent (a counter gone quiet, shutdown)",
            self.given_back_hits.clone(),
        );
        register(
            registry,
            names,
            "hot_lapsed_hits",
            "Claimed hits unspent when their window ended: counted, never admitted",
            self.lapsed_hits.clone(),
        );
        register(
            registry,
            names,
            "hot_descriptors",
            "Counters this replica follows for claims",
            self.descriptors.clone(),
        );
    }
}
