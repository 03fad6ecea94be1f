//! The flags of the quota service (`--rlqs-*`): whether Portcullis serves Envoy's Rate Limit
//! Quota Service next to RLS, the reporting interval its gateways use, and its bounds. Grouped
//! apart from the rest of `Settings` (flattened into it: the flags and variables are unchanged).

use std::time::Duration;

use clap::Args;

use super::parse_duration;

#[derive(Clone, Args)]
pub struct RlqsSettings {
    /// Serve envoy.service.rate_limit_quota.v3 (RLQS) on the gRPC port(s), from the same rules:
    /// gateways enforce their share of each rule locally, with no call per request. The grants
    /// live in the store: on Redis, every replica shares them.
    #[arg(long, env = "PORTCULLIS_RLQS")]
    pub rlqs: bool,
    /// How often gateways report: assignments last two intervals and a second (a longer gap
    /// seen on a stream counts instead). Envoy 1.40 reports every 5 s whatever the filter's
    /// reporting_interval says.
    #[arg(long, env = "PORTCULLIS_RLQS_REPORTING_INTERVAL", default_value = "5s", value_parser = parse_duration)]
    pub rlqs_reporting_interval: Duration,
    /// Longest wait for the quota store in one report (Redis: the report's script calls). Apart
    /// from --store-timeout, which bounds an RLS call: a report of many buckets waits on nobody,
    /// and answering it by the failure mode would hand every bucket ALLOW_ALL.
    #[arg(long, env = "PORTCULLIS_RLQS_STORE_TIMEOUT", default_value = "1s", value_parser = parse_duration)]
    pub rlqs_store_timeout: Duration,
    /// How often each replica reads the descriptors on which a gateway is short of its fair
    /// share, and pushes smaller grants to its streams holding them (between reports); 0 turns
    /// pushes off (a newcomer then waits for the others' next reports).
    #[arg(long, env = "PORTCULLIS_RLQS_PUSH_INTERVAL", default_value = "500ms", value_parser = parse_duration)]
    pub rlqs_push_interval: Duration,
    /// How much of its share the token bucket a gateway is sent holds (Envoy's max_tokens: the
    /// share times this, at least two tokens where a fill brings two). Unset: a tenth of the
    /// rule's shortest window, at most a second (100ms on a second's rule, 1s on a minute's). A
    /// quiet gateway admits its bucket at once and the refill after it: past the rule in a
    /// window, by up to this much of its share. Longer serves bigger bursts (1s on a second's
    /// rule lets up to twice a gateway's share through within a second).
    #[arg(long, env = "PORTCULLIS_RLQS_BURST", value_parser = parse_duration)]
    pub rlqs_burst: Option<Duration>,
    /// RLQS streams open at once (one per gateway and worker set); more are refused.
    #[arg(long, env = "PORTCULLIS_RLQS_MAX_STREAMS", default_value_t = 1024)]
    pub rlqs_max_streams: usize,
    /// Buckets one stream may report; past it the stream is closed (RESOURCE_EXHAUSTED).
    #[arg(
        long,
        env = "PORTCULLIS_RLQS_MAX_BUCKETS_PER_STREAM",
        default_value_t = 10_000
    )]
    pub rlqs_max_buckets_per_stream: usize,
    /// Bytes of bucket ids (keys and values) one stream may hold; past it the stream is closed
    /// (RESOURCE_EXHAUSTED).
    #[arg(
        long,
        env = "PORTCULLIS_RLQS_MAX_BUCKET_BYTES_PER_STREAM",
        default_value_t = 4 << 20
    )]
    pub rlqs_max_bucket_bytes_per_stream: usize,
    /// Bytes of bucket ids all streams of this replica may hold together; a stream whose new
    /// buckets would pass it is closed (RESOURCE_EXHAUSTED).
    #[arg(long, env = "PORTCULLIS_RLQS_MAX_BUCKET_BYTES", default_value_t = 256 << 20)]
    pub rlqs_max_bucket_bytes: usize,
    /// Reports one stream may send in a second; past it, its next report waits for the next
    /// second (the stream stays open: Envoy reports every new bucket at once).
    #[arg(
        long,
        env = "PORTCULLIS_RLQS_MAX_REPORTS_PER_SECOND",
        default_value_t = 200
    )]
    pub rlqs_max_reports_per_second: u32,
}

/// Room for one bucket's framing in a report beyond its id's bytes: the map entries' tags and
/// lengths, `time_elapsed`, the two counters (a few entries' worth).
const REPORT_BYTES_PER_BUCKET: usize = 128;

impl RlqsSettings {
    /// Largest report a stream may send: what its bucket bounds let it hold, each bucket framed,
    /// and the domain. Envoy reports every bucket it holds in each report, so a limit below this
    /// would refuse, at every report, a gateway the bucket bounds admit (--max-message-bytes
    /// bounds RLS calls, a few hundred bytes each). About 5.3 MiB by default.
    pub fn max_report_bytes(&self, max_message_bytes: usize) -> usize {
        let buckets = self
            .rlqs_max_buckets_per_stream
            .saturating_mul(REPORT_BYTES_PER_BUCKET);
        self.rlqs_max_bucket_bytes_per_stream
            .saturating_add(buckets)
            .saturating_add(64 << 10)
            .max(max_message_bytes)
    }
}
