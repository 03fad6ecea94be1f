//! The load benchmark's scenarios: the rules the service runs, the request shape of each row,
//! and the minimal script that is Redis' ceiling. Rules here must never refuse a call a row
//! counts as allowed.

use super::*;

pub const RULES: &str = r#"
domain: bench
descriptors:
  - key: sw
    rate_limit: {unit: second, requests_per_unit: 1000000000}
  - key: tb
    rate_limit: {unit: second, requests_per_unit: 1000000000, algorithm: token_bucket, burst: 1000000000}
  - key: fw
    rate_limit: {unit: second, requests_per_unit: 1000000000, algorithm: fixed_window}
  - key: deny
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: a
    rate_limit: {unit: second, requests_per_unit: 1000000000}
  - key: b
    rate_limit: {unit: second, requests_per_unit: 1000000000}
  - key: c
    rate_limit: {unit: second, requests_per_unit: 1000000000}
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1000000000}
  - key: user_tb
    rate_limit: {unit: hour, requests_per_unit: 1000000000, algorithm: token_bucket, burst: 1000000000}
  - key: user_fw
    rate_limit: {unit: hour, requests_per_unit: 1000000000, algorithm: fixed_window}
  - key: at_sw
    rate_limit: {unit: second, requests_per_unit: 3000}
  - key: at_fw
    rate_limit: {unit: second, requests_per_unit: 3000, algorithm: fixed_window}
"#;

/// The limit of the rows at their limit (`at_sw`, `at_fw`: a second's rule), below what the
/// generator offers on every store: what a second admits of it is the row's result.
pub const AT_LIMIT: u64 = 3000;

/// A 10-line GCRA decision: TIME, GET, SET PX. The Redis ceiling: what one decision per script
/// call costs at the least.
pub const MINIMAL_SCRIPT: &str = "local t = redis.call('TIME') \
local now = tonumber(t[1]) * 1000000 + tonumber(t[2]) \
local emission = tonumber(ARGV[2]) \
local tat = tonumber(redis.call('GET', KEYS[1]) or now) \
if tat < now then tat = now end \
local new = tat + emission \
if new - now > tonumber(ARGV[1]) * emission then return 0 end \
redis.call('SET', KEYS[1], string.format('%.0f', new), 'PX', math.ceil((new - now) / 1000) + 1) \
return 1";

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scenario {
    /// One descriptor per call on one key, every call allowed: (label, key).
    One(&'static str, &'static str),
    /// One hot key, every call refused.
    Denied,
    /// One descriptor per call on one key of `AT_LIMIT` a second, offered more: every second
    /// admits its limit, less what the store under-admits (label, key).
    AtLimit(&'static str, &'static str),
    /// Three descriptors per call, every call allowed.
    Three,
    /// One descriptor per call over this many distinct values, every call allowed: the cold
    /// path, a counter met once in a while (label, key, values). A sliding or fixed window's
    /// counter of an hour stays between two calls on it; a token bucket's is full again and gone.
    ManyKeys(&'static str, &'static str, u64),
    /// One descriptor per call whose value no call of the run has sent before, every call
    /// allowed: every decision on a counter that does not exist yet (label, key).
    NewKeys(&'static str, &'static str),
    /// A concurrency rule: calls alternate a hold and its release (a request through Envoy is
    /// both), over 1000 values, every call allowed.
    Concurrency,
}

impl Scenario {
    pub fn label(self) -> String {
        match self {
            Scenario::One(label, _) => format!("one descriptor, {label}"),
            Scenario::Denied => "one hot key, denied".into(),
            Scenario::AtLimit(label, _) => format!("one descriptor at its limit, {label}"),
            Scenario::Three => "three descriptors".into(),
            Scenario::ManyKeys("", _, n) => format!("{}k distinct keys", n / 1000),
            Scenario::ManyKeys(label, _, n) => format!("{}k distinct keys, {label}", n / 1000),
            Scenario::NewKeys(label, _) => format!("new keys, {label}"),
            Scenario::Concurrency => "concurrency, a hold and a release".into(),
        }
    }

    pub fn request(self, i: u64) -> RateLimitRequest {
        let descriptor = |key: &str, value: String| RateLimitDescriptor {
            entries: vec![rate_limit_descriptor::Entry {
                key: key.into(),
                value,
            }],
            limit: None,
            hits_addend: None,
            is_negative_hits: false,
        };
        let descriptors = match self {
            Scenario::One(_, key) | Scenario::AtLimit(_, key) => {
                vec![descriptor(key, "x".into())]
            }
            Scenario::Denied => vec![descriptor("deny", "x".into())],
            Scenario::Three => ["a", "b", "c"]
                .iter()
                .map(|k| descriptor(k, "x".into()))
                .collect(),
            Scenario::ManyKeys(_, key, n) => vec![descriptor(key, (i % n).to_string())],
            // Counted over the whole process: a later round, on the same Redis, meets none of
            // an earlier one's keys.
            Scenario::NewKeys(_, key) => {
                vec![descriptor(
                    key,
                    NEW_KEYS.fetch_add(1, Ordering::Relaxed).to_string(),
                )]
            }
            Scenario::Concurrency => {
                let mut slot = descriptor("cc", (i / 2 % 1000).to_string());
                slot.is_negative_hits = i % 2 == 1;
                vec![slot]
            }
        };
        RateLimitRequest {
            domain: self.domain().into(),
            descriptors,
            hits_addend: 0,
        }
    }

    /// Checks one answer; the reason when it is wrong.
    pub fn verify(self, answer: &RateLimitResponse) -> Result<(), String> {
        let want = match self {
            Scenario::Denied => Code::OverLimit,
            // Either: what a second admits is counted apart.
            Scenario::AtLimit(..) if answer.overall_code == Code::OverLimit as i32 => {
                Code::OverLimit
            }
            _ => Code::Ok,
        };
        if answer.overall_code == want as i32 {
            Ok(())
        } else {
            Err(format!(
                "overall code {} (want {want:?})",
                answer.overall_code
            ))
        }
    }

    /// The rules domain it calls: the concurrency rule has its own file, written only when no
    /// build is compared (an older build refuses the algorithm).
    pub fn domain(self) -> &'static str {
        if self == Scenario::Concurrency {
            "bench_cc"
        } else {
            "bench"
        }
    }

    /// Rule hits (and refunds) one call adds to the service's counters.
    pub fn descriptors(self) -> u64 {
        if self == Scenario::Three { 3 } else { 1 }
    }
}

/// The values NewKeys has sent so far.
static NEW_KEYS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

pub const ALL: [Scenario; 14] = [
    Scenario::One("sliding window", "sw"),
    Scenario::One("token bucket", "tb"),
    Scenario::One("fixed window", "fw"),
    Scenario::AtLimit("sliding window", "at_sw"),
    Scenario::AtLimit("fixed window", "at_fw"),
    Scenario::Denied,
    Scenario::Three,
    Scenario::ManyKeys("", "user", 100_000),
    Scenario::ManyKeys("token bucket", "user_tb", 100_000),
    Scenario::ManyKeys("fixed window", "user_fw", 100_000),
    Scenario::NewKeys("sliding window", "user"),
    Scenario::NewKeys("token bucket", "user_tb"),
    Scenario::NewKeys("fixed window", "user_fw"),
    Scenario::Concurrency,
];

/// The concurrency scenario's rule: slots to spare (a release that overtakes its hold frees
/// nothing, and its hold's lease ends by itself).
pub const CONCURRENCY_RULES: &str = "domain: bench_cc
descriptors:
  - key: cc
    rate_limit: {algorithm: concurrency, requests_per_unit: 1000, unit: minute, max_duration: 10s}
";
