//! Turning decisions into Envoy's response: one status per descriptor in request order, the
//! overall code (quota descriptors and shadow mode as the Go service weighs them), the optional
//! rate-limit headers, and the optional dynamic metadata.

use std::time::Duration;

use super::config::{HeadersMode, ServiceConfig};
use super::plan::Planned;
use crate::pb::{HeaderValue, RateLimitRequest, RateLimitResponse, rate_limit_response};
use crate::rules::Unit;

use rate_limit_response::{Code, DescriptorStatus, RateLimit, rate_limit::Unit as PbUnit};

/// A unit as a status's `current_limit` carries it.
pub fn pb_unit(unit: Unit) -> PbUnit {
    match unit {
        Unit::Second => PbUnit::Second,
        Unit::Minute => PbUnit::Minute,
        Unit::Hour => PbUnit::Hour,
        Unit::Day => PbUnit::Day,
        Unit::Week => PbUnit::Week,
        Unit::Month => PbUnit::Month,
        Unit::Year => PbUnit::Year,
    }
}

/// Whole seconds, rounded up, so that a client waiting that long is never early.
fn ceil_seconds(d: Duration) -> i64 {
    let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    i64::try_from(secs).unwrap_or(i64::MAX)
}

fn status(p: &Planned) -> DescriptorStatus {
    let ok = Code::Ok as i32;
    let (Some(rule), Some((name, requests_per_unit, unit))) = (&p.rule, p.shown_limit()) else {
        return DescriptorStatus {
            code: ok,
            ..Default::default()
        };
    };
    let Some(decision) = p.decision else {
        // Unlimited: like the Go service, OK with the most remaining Envoy can carry.
        return DescriptorStatus {
            code: ok,
            limit_remaining: u32::MAX,
            ..Default::default()
        };
    };
    // Shadow-mode rules count and report, but never make a descriptor OVER_LIMIT.
    let code = if decision.allowed || rule.shadow_mode {
        Code::Ok
    } else {
        Code::OverLimit
    };
    if decision.by_failure_mode {
        // No counter was asked: no limit or remaining to report, so that Envoy builds no
        // x-ratelimit-* headers claiming a budget nobody counted. A refusal keeps its short,
        // honest wait.
        return DescriptorStatus {
            code: code as i32,
            duration_until_reset: (!decision.allowed).then(|| prost_types::Duration {
                seconds: ceil_seconds(decision.reset_after).max(1),
                nanos: 0,
            }),
            ..Default::default()
        };
    }
    // Refused: when this request would pass (Envoy's Retry-After is built from it), not when
    // the whole quota is back: a token bucket's next tokens, a sliding window's oldest hits
    // leaving, a fixed window's end (docs/algorithms.md). Allowed: when the quota is whole.
    let reset = if code == Code::OverLimit {
        ceil_seconds(decision.retry_after.unwrap_or(decision.reset_after)).max(1)
    } else {
        ceil_seconds(decision.reset_after)
    };
    DescriptorStatus {
        code: code as i32,
        current_limit: Some(RateLimit {
            name: name.unwrap_or_default().to_owned(),
            requests_per_unit,
            unit: unit.map_or(PbUnit::Unknown, pb_unit) as i32,
        }),
        limit_remaining: u32::try_from(decision.remaining).unwrap_or(u32::MAX),
        duration_until_reset: Some(prost_types::Duration {
            seconds: reset,
            nanos: 0,
        }),
        quota: None,
    }
}

/// Whether a descriptor counts as a quota: over its limit alone it does not refuse the call.
fn is_quota(p: &Planned, config: &ServiceConfig) -> bool {
    p.decision.is_some()
        && (config.global_quota_mode || p.rule.as_ref().is_some_and(|r| r.quota_mode))
}

pub fn build(
    request: &RateLimitRequest,
    planned: &[Planned],
    config: &ServiceConfig,
) -> RateLimitResponse {
    let statuses: Vec<DescriptorStatus> = planned.iter().map(status).collect();
    // As the Go service decides: OVER_LIMIT when an ordinary descriptor is over, or when every
    // quota descriptor of the call is.
    let over = |s: &DescriptorStatus| s.code == Code::OverLimit as i32;
    let (mut quotas, mut quotas_over, mut ordinary_over) = (0, 0, 0);
    for (p, s) in planned.iter().zip(&statuses) {
        match (is_quota(p, config), over(s)) {
            (true, true) => {
                quotas += 1;
                quotas_over += 1;
            }
            (true, false) => quotas += 1,
            (false, true) => ordinary_over += 1,
            (false, false) => {}
        }
    }
    let refused = ordinary_over > 0 || (quotas > 0 && quotas == quotas_over);
    let overall = if refused && !config.global_shadow_mode {
        Code::OverLimit
    } else {
        Code::Ok
    };
    let response_headers_to_add = headers(config, planned, &statuses, refused);
    let mut dynamic_metadata = config
        .dynamic_metadata
        .then(|| super::metadata::describe(request, planned, &statuses));
    for (key, value) in super::metadata::held(request, planned, config.charge, refused) {
        dynamic_metadata
            .get_or_insert_with(Default::default)
            .fields
            .insert(key, value);
    }
    RateLimitResponse {
        overall_code: overall as i32,
        statuses,
        response_headers_to_add,
        dynamic_metadata,
        ..Default::default()
    }
}

fn header(key: &str, value: String) -> HeaderValue {
    HeaderValue {
        key: key.to_owned(),
        value,
        raw_value: Vec::new(),
    }
}

/// The headers Envoy would compute: from the descriptor over its limit when one refuses the call
/// (the last one, as the Go service picks it), else the one with the least remaining; the limit
/// line listing every limit that applied as `<requests>;w=<window seconds>[;name="<name>"]`.
fn headers(
    config: &ServiceConfig,
    planned: &[Planned],
    statuses: &[DescriptorStatus],
    refused: bool,
) -> Vec<HeaderValue> {
    let defaults = match config.response_headers {
        HeadersMode::Off => return Vec::new(),
        HeadersMode::Draft03 => [
            "x-ratelimit-limit",
            "x-ratelimit-remaining",
            "x-ratelimit-reset",
        ],
        HeadersMode::Ietf => ["ratelimit-limit", "ratelimit-remaining", "ratelimit-reset"],
        HeadersMode::Go => ["RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"],
    };
    let named = &config.header_names;
    let names = [
        named.limit.as_deref().unwrap_or(defaults[0]),
        named.remaining.as_deref().unwrap_or(defaults[1]),
        named.reset.as_deref().unwrap_or(defaults[2]),
    ];
    let limited: Vec<(&Planned, &DescriptorStatus, &RateLimit)> = planned
        .iter()
        .zip(statuses)
        .filter_map(|(p, s)| s.current_limit.as_ref().map(|l| (p, s, l)))
        .collect();
    let refusing = limited
        .iter()
        .rev()
        .find(|(p, s, _)| s.code == Code::OverLimit as i32 && !is_quota(p, config));
    let Some(&(_, source, source_limit)) =
        refusing.or_else(|| limited.iter().min_by_key(|(_, s, _)| s.limit_remaining))
    else {
        // Nothing counted (failure-mode answers): no budget to show, only when to come back.
        if refused && config.response_headers != HeadersMode::Go {
            return vec![header(
                "retry-after",
                retry_wait(planned, statuses).to_string(),
            )];
        }
        return Vec::new();
    };
    let policy = |requests: u32, unit: Option<Unit>, name: &str| {
        let mut policy = format!("{requests};w={}", unit.map_or(0, Unit::seconds));
        if !name.is_empty() {
            policy.push_str(&format!(";name=\"{name}\""));
        }
        policy
    };
    // Every limit that applied; each layer of a layered descriptor is a policy of its own.
    let policies: Vec<String> = limited
        .iter()
        .flat_map(|(p, _, l)| {
            if p.layers.is_empty() {
                let unit = p.rule.as_ref().and_then(|r| r.unit);
                vec![policy(l.requests_per_unit, unit, &l.name)]
            } else {
                p.layers
                    .iter()
                    .map(|lp| {
                        let layer = &lp.layer;
                        let name = layer.name.as_deref().unwrap_or_default();
                        policy(layer.requests_per_unit, Some(layer.unit), name)
                    })
                    .collect()
            }
        })
        .collect();
    let reset = source.duration_until_reset.map_or(0, |d| d.seconds);
    if config.response_headers == HeadersMode::Go {
        return vec![
            header(names[0], source_limit.requests_per_unit.to_string()),
            header(names[1], source.limit_remaining.to_string()),
            header(names[2], reset.to_string()),
        ];
    }
    let mut out = Vec::with_capacity(5);
    match config.response_headers {
        HeadersMode::Draft03 => out.push(header(
            names[0],
            format!(
                "{}, {}",
                source_limit.requests_per_unit,
                policies.join(", ")
            ),
        )),
        _ => {
            out.push(header(names[0], source_limit.requests_per_unit.to_string()));
            out.push(header("ratelimit-policy", policies.join(", ")));
        }
    }
    out.push(header(names[1], source.limit_remaining.to_string()));
    out.push(header(names[2], reset.to_string()));
    if refused {
        out.push(header(
            "retry-after",
            retry_wait(planned, statuses).to_string(),
        ));
    }
    out
}

/// The longest wait among the descriptors that refused: only then would the request pass.
fn retry_wait(planned: &[Planned], statuses: &[DescriptorStatus]) -> i64 {
    planned
        .iter()
        .zip(statuses)
        .filter(|(_, s)| s.code == Code::OverLimit as i32)
        .filter_map(|(p, _)| p.decision)
        .map(|d| ceil_seconds(d.retry_after.unwrap_or(d.reset_after)).max(1))
        .max()
        .unwrap_or(1)
}
