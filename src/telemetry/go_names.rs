//! envoyproxy/ratelimit's names for our metrics, for dashboards and alerts built on the Go
//! service: its statsd stat names (`ratelimit.service.rate_limit.<domain>.<key>.total_hits`), and
//! the Prometheus names and labels its Prometheus sink makes of them (statsd_exporter with its
//! default mapping: `ratelimit_service_rate_limit_total_hits{domain, key1[, key2]}`).
//!
//! Computed from our own exposition at the time of asking, so the request path pays nothing for
//! it. It must never invent a series: only what Portcullis counts is named.

use std::collections::BTreeMap;
use std::fmt::Write;

use super::Metrics;
use super::statsd_mapping::{escape_label, escape_name};

/// One sample of our exposition: name, labels, value.
#[derive(Debug, Clone, PartialEq)]
struct Sample {
    name: String,
    labels: Vec<(String, String)>,
    value: f64,
}

impl Sample {
    fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// Parses the OpenMetrics text we write ourselves (`name{k="v",...} value`).
fn samples(text: &str) -> Vec<Sample> {
    let mut out = Vec::new();
    for line in text.lines() {
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let (series, value) = match line.rsplit_once(' ') {
            Some(pair) => pair,
            None => continue,
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        let (name, labels) = match series.split_once('{') {
            None => (series.to_owned(), Vec::new()),
            Some((name, rest)) => (
                name.to_owned(),
                parse_labels(rest.strip_suffix('}').unwrap_or(rest)),
            ),
        };
        out.push(Sample {
            name,
            labels,
            value,
        });
    }
    out
}

fn parse_labels(text: &str) -> Vec<(String, String)> {
    let mut labels = Vec::new();
    let mut chars = text.chars().peekable();
    loop {
        let key: String = chars.by_ref().take_while(|&c| c != '=').collect();
        if key.is_empty() || chars.next() != Some('"') {
            break;
        }
        let mut value = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some('n') => value.push('\n'),
                    Some(other) => value.push(other),
                    None => break,
                },
                '"' => break,
                c => value.push(c),
            }
        }
        labels.push((key.trim_start_matches(',').to_owned(), value));
        if chars.peek() == Some(&',') {
            chars.next();
        }
    }
    labels
}

/// The Go service's `SanitizeStatName`: `:` and `|` become `_`, and so do the dots of an IPv4
/// address (a statsd name splits at dots).
pub fn sanitize_stat_name(name: &str) -> String {
    let replaced: String = name
        .chars()
        .map(|c| if c == ':' || c == '|' { '_' } else { c })
        .collect();
    let bytes = replaced.as_bytes();
    let mut out = String::with_capacity(replaced.len());
    let mut i = 0;
    while i < bytes.len() {
        if let Some(len) = ipv4_at(bytes, i) {
            out.push_str(&replaced[i..i + len].replace('.', "_"));
            i += len;
        } else {
            // Safe: only ASCII is ever matched above, so `i` stays on a character boundary.
            let c = replaced[i..].chars().next().unwrap_or('_');
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

/// The length of `\d{1,3}(\.\d{1,3}){3}` starting at `at`, as Go's regexp finds it (leftmost
/// first, greedy; no word boundary, so the match may start inside a longer run of digits).
fn ipv4_at(bytes: &[u8], at: usize) -> Option<usize> {
    let digits = |from: usize| {
        bytes[from..]
            .iter()
            .take(3)
            .take_while(|b| b.is_ascii_digit())
            .count()
    };
    let mut pos = at;
    for group in 0..4 {
        let n = digits(pos);
        if n == 0 {
            return None;
        }
        pos += n;
        if group < 3 {
            if bytes.get(pos) != Some(&b'.') {
                return None;
            }
            pos += 1;
        }
    }
    Some(pos - at)
}

/// Which of our rule counters is which Go stat.
const RULE_STATS: [(&str, &str); 5] = [
    ("portcullis_rule_hits_total", "total_hits"),
    ("portcullis_rule_over_limit_total", "over_limit"),
    ("portcullis_rule_near_limit_total", "near_limit"),
    ("portcullis_rule_within_limit_total", "within_limit"),
    ("portcullis_rule_shadow_mode_total", "shadow_mode"),
];

/// Go's statsd counters with their current (cumulative) values.
pub fn statsd_counters(metrics: &Metrics) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let mut add = |name: String, value: f64| {
        *out.entry(name).or_insert(0) += value as u64;
    };
    for s in samples(&metrics.encode()) {
        if let Some((_, stat)) = RULE_STATS.iter().find(|(ours, _)| *ours == s.name) {
            let rule = s.label("rule").unwrap_or("");
            add(
                format!(
                    "ratelimit.service.rate_limit.{}.{stat}",
                    sanitize_stat_name(rule)
                ),
                s.value,
            );
            continue;
        }
        match (s.name.as_str(), s.label("result")) {
            ("portcullis_rules_reloads_total", Some("success")) => {
                add("ratelimit.service.config_load_success".into(), s.value)
            }
            ("portcullis_rules_reloads_total", Some(_)) => {
                add("ratelimit.service.config_load_error".into(), s.value)
            }
            ("portcullis_store_errors_total", _) => add(
                "ratelimit.service.call.should_rate_limit.redis_error".into(),
                s.value,
            ),
            ("portcullis_grpc_calls_total", _) => add(
                "ratelimit_server.ShouldRateLimit.total_requests".into(),
                s.value,
            ),
            _ => {}
        }
    }
    out
}

/// Go's one timer, `ratelimit_server.ShouldRateLimit.response_time`, from our call duration
/// histogram (in seconds, with our buckets), for a custom statsd_exporter mapping.
pub fn statsd_timers(metrics: &Metrics) -> BTreeMap<String, super::statsd_mapping::Observed> {
    let mut observed = super::statsd_mapping::Observed::default();
    let mut seen = false;
    for s in samples(&metrics.encode()) {
        match s.name.as_str() {
            "portcullis_grpc_call_duration_seconds_bucket" => {
                let le = s.label("le").unwrap_or("+Inf").to_owned();
                observed.buckets.push((le, s.value));
                seen = true;
            }
            "portcullis_grpc_call_duration_seconds_sum" => observed.sum += s.value,
            "portcullis_grpc_call_duration_seconds_count" => observed.count += s.value,
            _ => {}
        }
    }
    let mut out = BTreeMap::new();
    if seen {
        out.insert(
            "ratelimit_server.ShouldRateLimit.response_time".to_owned(),
            observed,
        );
    }
    out
}

/// A statsd name mapped as the Go service's default statsd_exporter mapping maps it: the rule
/// stats to one metric per stat with `domain`, `key1` and (for deeper keys) `key2` labels.
fn map_rule_stat(stat_key: &str, stat: &str) -> (String, Vec<(&'static str, String)>) {
    let parts: Vec<&str> = stat_key.split('.').collect();
    let name = format!("ratelimit_service_rate_limit_{stat}");
    match parts.as_slice() {
        [domain, key1] => (
            name,
            vec![("domain", (*domain).into()), ("key1", (*key1).into())],
        ),
        [domain, key1, key2, ..] => (
            name,
            vec![
                ("domain", (*domain).into()),
                ("key1", (*key1).into()),
                ("key2", (*key2).into()),
            ],
        ),
        // Not matched by the mapping: statsd_exporter's escaped full name, no labels.
        _ => (
            escape_name(&format!("ratelimit.service.rate_limit.{stat_key}.{stat}")),
            Vec::new(),
        ),
    }
}

/// The Prometheus exposition the Go service's Prometheus sink would serve for our counts.
pub fn prometheus_text(metrics: &Metrics) -> String {
    let all = samples(&metrics.encode());
    // name -> (type, labels -> value), labels rendered.
    let mut families: BTreeMap<String, (&str, BTreeMap<String, f64>)> = BTreeMap::new();
    let mut add = |name: String, kind: &'static str, labels: &[(&str, String)], value: f64| {
        let rendered = labels
            .iter()
            .map(|(k, v)| format!("{k}=\"{}\"", escape_label(v)))
            .collect::<Vec<_>>()
            .join(",");
        *families
            .entry(name)
            .or_insert((kind, BTreeMap::new()))
            .1
            .entry(rendered)
            .or_insert(0.0) += value;
    };
    for s in &all {
        if let Some((_, stat)) = RULE_STATS.iter().find(|(ours, _)| *ours == s.name) {
            let key = sanitize_stat_name(s.label("rule").unwrap_or(""));
            let (name, labels) = map_rule_stat(&key, stat);
            add(name, "counter", &labels, s.value);
            continue;
        }
        let method = [("grpc_method", "ShouldRateLimit".to_owned())];
        match (s.name.as_str(), s.label("result")) {
            ("portcullis_rules_reloads_total", Some("success")) => add(
                "ratelimit_service_config_load_success".into(),
                "counter",
                &[],
                s.value,
            ),
            ("portcullis_rules_reloads_total", Some(_)) => add(
                "ratelimit_service_config_load_error".into(),
                "counter",
                &[],
                s.value,
            ),
            ("portcullis_store_errors_total", _) => add(
                "ratelimit_service_should_rate_limit_error".into(),
                "counter",
                &[("err_type", "redis_error".into())],
                s.value,
            ),
            ("portcullis_grpc_calls_total", _) => add(
                "ratelimit_service_total_requests".into(),
                "counter",
                &method,
                s.value,
            ),
            ("portcullis_grpc_call_duration_seconds_bucket", _) => {
                let le = s.label("le").unwrap_or("+Inf").to_owned();
                add(
                    "ratelimit_service_response_time_seconds_bucket".into(),
                    "histogram",
                    &[method[0].clone(), ("le", le)],
                    s.value,
                )
            }
            ("portcullis_grpc_call_duration_seconds_sum", _) => add(
                "ratelimit_service_response_time_seconds_sum".into(),
                "histogram",
                &method,
                s.value,
            ),
            ("portcullis_grpc_call_duration_seconds_count", _) => add(
                "ratelimit_service_response_time_seconds_count".into(),
                "histogram",
                &method,
                s.value,
            ),
            _ => {}
        }
    }
    let mut out = String::new();
    let mut typed = std::collections::BTreeSet::new();
    for (name, (kind, series)) in &families {
        let family = name
            .strip_suffix("_bucket")
            .or_else(|| name.strip_suffix("_sum"))
            .or_else(|| name.strip_suffix("_count"))
            .filter(|_| *kind == "histogram")
            .unwrap_or(name);
        if typed.insert(family.to_owned()) {
            let _ = writeln!(out, "# TYPE {family} {kind}");
        }
        for (labels, value) in series {
            if labels.is_empty() {
                let _ = writeln!(out, "{name} {value}");
            } else {
                let _ = writeln!(out, "{name}{{{labels}}} {value}");
            }
        }
    }
    out
}

#[cfg(test)]
#[path = "go_names_tests.rs"]
mod tests;
