//! One usage report of one stream turned into bucket actions: each bucket matched to its rule
//! (through the decider's own plan, so RLS and RLQS meet the same rule, scaled the same), its
//! demand put to the quota store, the grant written as a token bucket Envoy can enforce. It must
//! never deny a bucket no enforced rule limits, and never accept a malformed report in part.

use std::collections::HashMap;
use std::time::Duration;

use tonic::Status;

use super::QuotaConfig;
use crate::algorithm::key::descriptor_tag;
use crate::algorithm::share::Tokens;
use crate::pb::rlqs::{
    BlanketRule, BucketAction, BucketId, BucketQuotaUsage, RateLimitQuotaResponse,
    RateLimitStrategy, Strategy, TokenBucket, bucket_action,
};
use crate::pb::{RateLimitDescriptor, RateLimitRequest, rate_limit_descriptor};
use crate::rules::Snapshot;
use crate::service::Decider;
use crate::store::quota::{Ask, AskKind};

/// A bucket id in a stable order (the map's entries sorted): one bucket, one key.
pub(super) type BucketKey = Vec<(String, String)>;

/// What a stream knows of one of its buckets.
#[derive(Debug, Clone, Default)]
pub(super) struct BucketState {
    /// The rule it met at its last report (`None`: none, it was allowed).
    pub rule: Option<String>,
    /// The token bucket last sent for it.
    pub sent: Option<Tokens>,
    /// The descriptor (store key) whose share it holds part of, if any.
    pub counter: Option<String>,
    /// Its demand at its last report, requests per second.
    pub demand: f64,
}

/// The grant to send: the one sent before when it is a little smaller than the new one (at
/// least nine tenths of it). Envoy replaces a token bucket that changes with a full one, so each
/// change can let a bucketful through; sending less than granted never over-admits.
pub(super) fn steady(before: Option<Tokens>, grant: Tokens) -> Tokens {
    match before {
        Some(b)
            if b.per_second() <= grant.per_second()
                && b.per_second() >= 0.9 * grant.per_second() =>
        {
            b
        }
        _ => grant,
    }
}

/// Checks one bucket's usage: an id of 1 to `max_entries` non-empty keys and values within
/// `max_string_bytes`.
pub(super) fn bucket_key(
    usage: &BucketQuotaUsage,
    config: &QuotaConfig,
) -> Result<BucketKey, Status> {
    let id = usage
        .bucket_id
        .as_ref()
        .ok_or_else(|| Status::invalid_argument("a bucket usage has no bucket_id"))?;
    if id.bucket.is_empty() || id.bucket.len() > config.max_entries {
        return Err(Status::invalid_argument(format!(
            "a bucket_id has {} entries: 1 to {} are accepted",
            id.bucket.len(),
            config.max_entries
        )));
    }
    let mut key: BucketKey = Vec::with_capacity(id.bucket.len());
    for (k, v) in &id.bucket {
        if k.is_empty() || v.is_empty() {
            return Err(Status::invalid_argument(
                "a bucket_id has an empty key or value",
            ));
        }
        if k.len() > config.max_string_bytes || v.len() > config.max_string_bytes {
            return Err(Status::invalid_argument(format!(
                "a bucket_id key or value is longer than {} bytes",
                config.max_string_bytes
            )));
        }
        key.push((k.clone(), v.clone()));
    }
    key.sort();
    Ok(key)
}

/// What one bucket of a report comes to: the rule it met, the ask for its share, and its
/// descriptor's rate limits (the counters its admissions are charged into; RLS checks on them
/// count its grant's claim meanwhile: `algorithm::claims`).
#[derive(Default)]
pub(super) struct BucketPlan {
    pub rule: Option<String>,
    pub ask: Option<Ask>,
    pub layers: Vec<crate::algorithm::Check>,
}

/// The rule the bucket meets and, when an enforced limit applies, the ask for its share.
pub(super) fn plan(
    decider: &Decider,
    snapshot: &Snapshot,
    domain: &str,
    key: &BucketKey,
    gateway: u64,
    demand: f64,
    ttl: Duration,
) -> BucketPlan {
    let Some(ordered) = snapshot.bucket_descriptor(domain, key) else {
        return BucketPlan::default();
    };
    let request = RateLimitRequest {
        domain: domain.to_owned(),
        descriptors: vec![RateLimitDescriptor {
            entries: ordered
                .into_iter()
                .map(|(key, value)| rate_limit_descriptor::Entry { key, value })
                .collect(),
            ..Default::default()
        }],
        hits_addend: 0,
    };
    let Ok(mut planned) = decider.plan_call(&request) else {
        return BucketPlan::default();
    };
    let planned = planned.swap_remove(0);
    let Some(rule) = planned.rule.as_ref() else {
        return BucketPlan::default();
    };
    let name = Some(rule.full_key.clone());
    // Shadow mode, the rule's or the deployment's (`--shadow-mode`, Go's SHADOW_MODE): RLS
    // answers OK and counts; a gateway is allowed everything. (A quota_mode rule changes
    // nothing here: a bucket is one descriptor, and a call of one quota descriptor over its
    // limit is refused as any other.)
    if rule.shadow_mode || rule.is_unlimited() || decider.config.global_shadow_mode {
        return BucketPlan {
            rule: name,
            ..BucketPlan::default()
        };
    }
    // The tightest limit binds: a layered rule's layer of the lowest rate. A concurrency limit
    // has no rate (slots over a lease are not requests per second) and no token bucket can say
    // "in flight": RLQS leaves it out (docs/envoy.md).
    let layers: Vec<crate::algorithm::Check> = planned
        .check
        .iter()
        .chain(planned.layers.iter().map(|l| &l.check))
        .filter(|c| c.limit.algorithm != crate::algorithm::Algorithm::Concurrency)
        .cloned()
        .collect();
    let rate = |c: &crate::algorithm::Check| c.limit.per_second();
    let Some(binding) = layers.iter().min_by(|a, b| rate(a).total_cmp(&rate(b))) else {
        return BucketPlan {
            rule: name,
            ..BucketPlan::default()
        };
    };
    let ask = Ask {
        // The descriptor: every layer's counter (and an RLS call's) shares its tag.
        key: descriptor_tag(&binding.key).to_owned(),
        capacity: rate(binding),
        gateway,
        demand,
        ttl_us: u64::try_from(ttl.as_micros()).unwrap_or(u64::MAX),
        kind: AskKind::Grant,
        // Set per report by whether its admissions were charged (`answer.rs`).
        charged: false,
        window_us: layers.iter().map(|c| c.limit.window_us).max().unwrap_or(0),
        shortest_us: layers.iter().map(|c| c.limit.window_us).min().unwrap_or(0),
        // Read per report, after its charges (`charge.rs`).
        rooms: Vec::new(),
        counters: Vec::new(),
    };
    BucketPlan {
        rule: name,
        ask: Some(ask),
        layers,
    }
}

fn action(id: BucketId, strategy: Option<Strategy>, ttl: Duration) -> BucketAction {
    BucketAction {
        bucket_id: Some(id),
        bucket_action: Some(bucket_action::BucketAction::QuotaAssignmentAction(
            bucket_action::QuotaAssignmentAction {
                assignment_time_to_live: Some(prost_types::Duration {
                    seconds: i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX),
                    nanos: 0,
                }),
                rate_limit_strategy: strategy.map(|s| RateLimitStrategy { strategy: Some(s) }),
            },
        )),
    }
}

pub(super) fn allow_all(id: BucketId, ttl: Duration) -> BucketAction {
    action(
        id,
        Some(Strategy::BlanketRule(BlanketRule::AllowAll as i32)),
        ttl,
    )
}

pub(super) fn deny_all(id: BucketId, ttl: Duration) -> BucketAction {
    action(
        id,
        Some(Strategy::BlanketRule(BlanketRule::DenyAll as i32)),
        ttl,
    )
}

/// A grant as Envoy enforces it: a token bucket that holds `Tokens::burst` (`burst` of the
/// share, at least two tokens where a fill brings two) and refills `per_fill` every `every_s`
/// seconds.
pub(super) fn token_bucket(
    id: BucketId,
    grant: Tokens,
    burst: Duration,
    ttl: Duration,
) -> BucketAction {
    let bucket = TokenBucket {
        max_tokens: grant.burst(burst),
        tokens_per_fill: Some(grant.per_fill),
        // Envoy 1.40 keeps whole seconds of the interval, but tells two buckets apart by the
        // interval's nanoseconds only: these nanoseconds (a few µs at most, dropped by Envoy)
        // make a change of interval a change of bucket there.
        fill_interval: Some(prost_types::Duration {
            seconds: i64::from(grant.every_s),
            nanos: i32::try_from(grant.every_s).unwrap_or(0),
        }),
    };
    action(id, Some(Strategy::TokenBucket(bucket)), ttl)
}

pub(super) fn abandon(id: BucketId) -> BucketAction {
    BucketAction {
        bucket_id: Some(id),
        bucket_action: Some(bucket_action::BucketAction::AbandonAction(
            bucket_action::AbandonAction {},
        )),
    }
}

/// The response to one report: an action per bucket reported, in the report's order.
pub(super) fn response(actions: Vec<BucketAction>) -> RateLimitQuotaResponse {
    RateLimitQuotaResponse {
        bucket_action: actions,
    }
}

/// The buckets of a stream (bounded by the caller).
pub(super) type Buckets = HashMap<BucketKey, BucketState>;

/// What an action assigns, for `/rlqs` and the granted-rate gauge.
pub(super) fn describe(
    key: &BucketKey,
    rule: Option<String>,
    action: &BucketAction,
) -> super::Assigned {
    let strategy = match &action.bucket_action {
        Some(bucket_action::BucketAction::QuotaAssignmentAction(a)) => {
            a.rate_limit_strategy.as_ref().and_then(|s| s.strategy)
        }
        _ => None,
    };
    let (assignment, rate) = match strategy {
        Some(Strategy::TokenBucket(b)) => {
            let per_fill = b.tokens_per_fill.unwrap_or(1);
            let every = b.fill_interval.map_or(1, |d| d.seconds.max(1));
            (
                format!("token_bucket {per_fill}/{every}s"),
                Some(f64::from(per_fill) / every as f64),
            )
        }
        Some(Strategy::BlanketRule(r)) if r == BlanketRule::DenyAll as i32 => {
            ("deny_all".into(), Some(0.0))
        }
        _ => ("allow_all".into(), None),
    };
    super::Assigned {
        bucket: key.iter().cloned().collect(),
        rule,
        assignment,
        rate,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slightly_larger_grant_keeps_the_bucket_envoy_has() {
        let t = |per_fill, every_s| Tokens { per_fill, every_s };
        // Nine of ten: Envoy keeps its bucket (no full bucket let through for one token more).
        assert_eq!(steady(Some(t(9, 1)), t(10, 1)), t(9, 1));
        // Less than nine tenths, or a smaller grant: the new one.
        assert_eq!(steady(Some(t(8, 1)), t(10, 1)), t(10, 1));
        assert_eq!(steady(Some(t(10, 1)), t(9, 1)), t(9, 1));
        assert_eq!(steady(None, t(10, 1)), t(10, 1));
    }
}
