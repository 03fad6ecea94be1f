//! Turning decisions into Envoy's response: one status per descriptor in request order, the
//! overall code, and the optional rate-limit headers.

use std::sync::Arc;
use std::time::Duration;

use crate::algorithm::{Check, Decision};
use crate::pb::{HeaderValue, RateLimitResponse, rate_limit_response};
use crate::rules::{Rule, Unit};

use rate_limit_response::{Code, DescriptorStatus, RateLimit, rate_limit::Unit as PbUnit};

/// Which rate-limit headers to add to the response Envoy sends downstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HeadersMode {
    /// None (Envoy's default).
    #[default]
    Off,
    /// `x-ratelimit-limit`, `-remaining`, `-reset` as in draft-polli-ratelimit-headers-03, the
    /// format Envoy itself writes; plus `retry-after` when over the limit.
    Draft03,
    /// `ratelimit-limit`, `-remaining`, `-reset` and `ratelimit-policy`; plus `retry-after`.
    Ietf,
}

/// One descriptor of a call, from resolution to decision.
#[derive(Debug)]
pub struct Planned {
    pub rule: Option<Arc<Rule>>,
    pub check: Option<Check>,
    pub hits: u64,
    pub decision: Option<Decision>,
    pub unknown_domain: bool,
}

fn pb_unit(unit: Unit) -> PbUnit {
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
    let Some(rule) = &p.rule else {
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
    let mut reset = ceil_seconds(decision.reset_after);
    if code == Code::OverLimit {
        reset = reset.max(1);
    }
    DescriptorStatus {
        code: code as i32,
        current_limit: Some(RateLimit {
            name: rule.name.clone().unwrap_or_default(),
            requests_per_unit: rule.requests_per_unit,
            unit: rule.unit.map_or(PbUnit::Unknown, pb_unit) as i32,
        }),
        limit_remaining: u32::try_from(decision.remaining).unwrap_or(u32::MAX),
        duration_until_reset: Some(prost_types::Duration {
            seconds: reset,
            nanos: 0,
        }),
    }
}

pub fn build(planned: &[Planned], config: &super::decider::ServiceConfig) -> RateLimitResponse {
    let statuses: Vec<DescriptorStatus> = planned.iter().map(status).collect();
    let over = statuses.iter().any(|s| s.code == Code::OverLimit as i32);
    let overall = if over && !config.global_shadow_mode {
        Code::OverLimit
    } else {
        Code::Ok
    };
    let response_headers_to_add = headers(config.response_headers, planned, &statuses, over);
    RateLimitResponse {
        overall_code: overall as i32,
        statuses,
        response_headers_to_add,
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

/// The headers Envoy would compute: from the status with the least remaining, the limit line
/// listing every limit that applied as `<requests>;w=<window seconds>[;name="<name>"]`.
fn headers(
    mode: HeadersMode,
    planned: &[Planned],
    statuses: &[DescriptorStatus],
    over: bool,
) -> Vec<HeaderValue> {
    let names = match mode {
        HeadersMode::Off => return Vec::new(),
        HeadersMode::Draft03 => [
            "x-ratelimit-limit",
            "x-ratelimit-remaining",
            "x-ratelimit-reset",
        ],
        HeadersMode::Ietf => ["ratelimit-limit", "ratelimit-remaining", "ratelimit-reset"],
    };
    let limited: Vec<(&Planned, &DescriptorStatus, &RateLimit)> = planned
        .iter()
        .zip(statuses)
        .filter_map(|(p, s)| s.current_limit.as_ref().map(|l| (p, s, l)))
        .collect();
    let Some(&(_, tightest, tightest_limit)) =
        limited.iter().min_by_key(|(_, s, _)| s.limit_remaining)
    else {
        return Vec::new();
    };
    let policies: Vec<String> = limited
        .iter()
        .map(|(p, _, l)| {
            let window = p
                .rule
                .as_ref()
                .and_then(|r| r.unit)
                .map_or(0, Unit::seconds);
            let mut policy = format!("{};w={window}", l.requests_per_unit);
            if !l.name.is_empty() {
                policy.push_str(&format!(";name=\"{}\"", l.name));
            }
            policy
        })
        .collect();
    let reset = tightest.duration_until_reset.map_or(0, |d| d.seconds);
    let mut out = Vec::with_capacity(5);
    match mode {
        HeadersMode::Draft03 => out.push(header(
            names[0],
            format!(
                "{}, {}",
                tightest_limit.requests_per_unit,
                policies.join(", ")
            ),
        )),
        _ => {
            out.push(header(
                names[0],
                tightest_limit.requests_per_unit.to_string(),
            ));
            out.push(header("ratelimit-policy", policies.join(", ")));
        }
    }
    out.push(header(names[1], tightest.limit_remaining.to_string()));
    out.push(header(names[2], reset.to_string()));
    if over {
        // The longest wait among the descriptors that refused: only then would the request pass.
        let wait = planned
            .iter()
            .zip(statuses)
            .filter(|(_, s)| s.code == Code::OverLimit as i32)
            .filter_map(|(p, _)| p.decision)
            .map(|d| ceil_seconds(d.retry_after.unwrap_or(d.reset_after)).max(1))
            .max()
            .unwrap_or(1);
        out.push(header("retry-after", wait.to_string()));
    }
    out
}
