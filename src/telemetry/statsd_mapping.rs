//! A statsd_exporter mapping file (the format envoyproxy/ratelimit reads from
//! `PROMETHEUS_MAPPER_YAML`, and Envoy Gateway mounts at `/etc/statsd-exporter/conf.yaml`) applied
//! to the Go service's stat names, so that the Prometheus series a deployment's dashboards and
//! alerts were built on come out the same after the image swap.
//!
//! What is read: `mappings` in order, the first that matches a stat wins; `match` as a glob (`*`
//! one run of characters without a dot, each a capture) or, with `match_type: regex`, a regular
//! expression; `name` and `labels` with `$1`/`${1}` (or named) captures expanded;
//! `match_metric_type` (counter, gauge, observer); `action: drop`. A stat no mapping matches is
//! exported as statsd_exporter does, its name with every character outside `[a-zA-Z0-9_]` as `_`
//! and no labels. Timer options (`timer_type`, buckets) shape nothing here: the one timer, the
//! response time, keeps Portcullis' own buckets, in seconds. Parsing never panics on any input,
//! and a file that does not parse stops the start (nothing is half applied).

use std::collections::BTreeMap;
use std::fmt::Write;

use regex::Regex;
use serde::Deserialize;

/// The most mappings one file may hold (operator input, bounded all the same).
const MAX_MAPPINGS: usize = 1000;

#[derive(Debug, Deserialize)]
struct FileYaml {
    #[serde(default)]
    mappings: Vec<MappingYaml>,
}

#[derive(Debug, Deserialize)]
struct MappingYaml {
    #[serde(rename = "match")]
    pattern: String,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    match_type: Option<String>,
    #[serde(default)]
    match_metric_type: Option<String>,
    #[serde(default)]
    action: Option<String>,
}

/// What kind of statsd stat an event is, for `match_metric_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatKind {
    Counter,
    Observer,
}

/// Which stats a mapping takes (`match_metric_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KindFilter {
    Any,
    Only(StatKind),
    Never,
}

#[derive(Debug)]
struct Mapping {
    pattern: Regex,
    name: String,
    labels: Vec<(String, String)>,
    kind: KindFilter,
    drop: bool,
}

/// A parsed mapping file.
#[derive(Debug)]
pub struct StatsdMapping {
    mappings: Vec<Mapping>,
}

/// Where one stat goes: a metric name and its labels, or nowhere.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mapped {
    Series {
        name: String,
        labels: Vec<(String, String)>,
    },
    Dropped,
}

/// A glob of statsd_exporter (`*` matches a run of non-dot characters) as an anchored regex.
fn glob_regex(glob: &str) -> Result<Regex, regex::Error> {
    let mut out = String::from("^");
    for (i, part) in glob.split('*').enumerate() {
        if i > 0 {
            out.push_str("([^.]*)");
        }
        out.push_str(&regex::escape(part));
    }
    out.push('$');
    Regex::new(&out)
}

impl StatsdMapping {
    /// Parses a mapping file's text; a clear error for anything it cannot honour.
    pub fn parse(text: &str) -> Result<StatsdMapping, String> {
        let file: FileYaml = serde_saphyr::from_str(text).map_err(|e| e.to_string())?;
        if file.mappings.len() > MAX_MAPPINGS {
            return Err(format!("more than {MAX_MAPPINGS} mappings"));
        }
        let mut mappings = Vec::with_capacity(file.mappings.len());
        for (i, m) in file.mappings.into_iter().enumerate() {
            let at = |what: String| format!("mapping {} ({:?}): {what}", i + 1, m.pattern);
            let pattern = match m.match_type.as_deref() {
                None | Some("glob" | "") => glob_regex(&m.pattern),
                Some("regex") => Regex::new(&m.pattern),
                Some(other) => {
                    return Err(at(format!("match_type {other:?} is not glob or regex")));
                }
            }
            .map_err(|e| at(e.to_string()))?;
            let drop = match m.action.as_deref() {
                None | Some("map" | "") => false,
                Some("drop") => true,
                Some(other) => return Err(at(format!("action {other:?} is not map or drop"))),
            };
            let kind = match m.match_metric_type.as_deref() {
                None | Some("") => KindFilter::Any,
                Some("counter") => KindFilter::Only(StatKind::Counter),
                Some("observer" | "timer" | "histogram" | "summary" | "distribution") => {
                    KindFilter::Only(StatKind::Observer)
                }
                // No gauge is exported under the Go names: such a mapping matches nothing.
                Some("gauge") => KindFilter::Never,
                Some(other) => return Err(at(format!("match_metric_type {other:?} is unknown"))),
            };
            let name = match (m.name, drop) {
                (Some(name), _) => name,
                (None, true) => String::new(),
                (None, false) => return Err(at("a mapping that maps needs a name".into())),
            };
            mappings.push(Mapping {
                pattern,
                name,
                labels: m.labels.into_iter().collect(),
                kind,
                drop,
            });
        }
        Ok(StatsdMapping { mappings })
    }

    /// Where `stat` (a statsd name) of `kind` goes.
    pub fn map(&self, stat: &str, kind: StatKind) -> Mapped {
        for m in &self.mappings {
            let takes = match m.kind {
                KindFilter::Any => true,
                KindFilter::Only(k) => k == kind,
                KindFilter::Never => false,
            };
            if !takes {
                continue;
            }
            let Some(captures) = m.pattern.captures(stat) else {
                continue;
            };
            if m.drop {
                return Mapped::Dropped;
            }
            let expand = |template: &str| {
                let mut out = String::new();
                captures.expand(template, &mut out);
                out
            };
            return Mapped::Series {
                name: expand(&m.name),
                labels: m
                    .labels
                    .iter()
                    .map(|(k, v)| (k.clone(), expand(v)))
                    .collect(),
            };
        }
        Mapped::Series {
            name: escape_name(stat),
            labels: Vec::new(),
        }
    }
}

/// statsd_exporter's escaping of an unmapped name: anything but `[a-zA-Z0-9_]` becomes `_`.
pub fn escape_name(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// A label value in the exposition's quoting.
pub(super) fn escape_label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn render_labels(labels: &[(String, String)]) -> String {
    labels
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", escape_label(v)))
        .collect::<Vec<_>>()
        .join(",")
}

/// One histogram as the exposition has it: `(le, cumulative count)` per bucket, sum, count.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Observed {
    pub buckets: Vec<(String, f64)>,
    pub sum: f64,
    pub count: f64,
}

/// The Prometheus exposition of the Go stats (`counters` by statsd name; `timers` by statsd
/// name) as `mapping` maps them. Two stats mapped to one series add up.
pub fn exposition(
    mapping: &StatsdMapping,
    counters: &BTreeMap<String, u64>,
    timers: &BTreeMap<String, Observed>,
) -> String {
    let mut counted: BTreeMap<String, BTreeMap<String, f64>> = BTreeMap::new();
    for (stat, value) in counters {
        if let Mapped::Series { name, labels } = mapping.map(stat, StatKind::Counter) {
            *counted
                .entry(name)
                .or_default()
                .entry(render_labels(&labels))
                .or_insert(0.0) += *value as f64;
        }
    }
    let mut out = String::new();
    for (name, series) in &counted {
        let _ = writeln!(out, "# TYPE {name} counter");
        for (labels, value) in series {
            if labels.is_empty() {
                let _ = writeln!(out, "{name} {value}");
            } else {
                let _ = writeln!(out, "{name}{{{labels}}} {value}");
            }
        }
    }
    for (stat, observed) in timers {
        let Mapped::Series { name, labels } = mapping.map(stat, StatKind::Observer) else {
            continue;
        };
        let base = render_labels(&labels);
        let with = |extra: &str| match (base.is_empty(), extra.is_empty()) {
            (true, true) => String::new(),
            (true, false) => format!("{{{extra}}}"),
            (false, true) => format!("{{{base}}}"),
            (false, false) => format!("{{{base},{extra}}}"),
        };
        let _ = writeln!(out, "# TYPE {name} histogram");
        for (le, count) in &observed.buckets {
            let _ = writeln!(
                out,
                "{name}_bucket{} {count}",
                with(&format!("le=\"{le}\""))
            );
        }
        let _ = writeln!(out, "{name}_sum{} {}", with(""), observed.sum);
        let _ = writeln!(out, "{name}_count{} {}", with(""), observed.count);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const GATEWAY: &str = r#"
mappings:
  - match: "ratelimit.service.rate_limit.*.*.total_hits"
    name: "ratelimit_service_rate_limit_total_hits"
    timer_type: "histogram"
    labels:
      domain: "$1"
      key1: "$2"
  - match: "ratelimit.service.rate_limit.*.*.*.total_hits"
    name: "ratelimit_service_rate_limit_total_hits"
    labels:
      domain: "$1"
      key1: "$2"
      key2: "$3"
  - match: "ratelimit_server.*.total_requests"
    name: "ratelimit_service_total_requests"
    match_metric_type: counter
    labels:
      grpc_method: "$1"
  - match: "ratelimit_server.*.response_time"
    name: "ratelimit_service_response_time_seconds"
    timer_type: histogram
    labels:
      grpc_method: "$1"
  - match: "."
    match_type: "regex"
    action: "drop"
    name: "dropped"
"#;

    #[test]
    fn globs_capture_segments_and_the_catch_all_drops_the_rest() {
        let m = StatsdMapping::parse(GATEWAY).unwrap();
        assert_eq!(
            m.map(
                "ratelimit.service.rate_limit.edge.user.total_hits",
                StatKind::Counter
            ),
            Mapped::Series {
                name: "ratelimit_service_rate_limit_total_hits".into(),
                labels: vec![
                    ("domain".into(), "edge".into()),
                    ("key1".into(), "user".into())
                ],
            }
        );
        assert_eq!(
            m.map(
                "ratelimit.service.rate_limit.edge.a.b.total_hits",
                StatKind::Counter
            ),
            Mapped::Series {
                name: "ratelimit_service_rate_limit_total_hits".into(),
                labels: vec![
                    ("domain".into(), "edge".into()),
                    ("key1".into(), "a".into()),
                    ("key2".into(), "b".into()),
                ],
            }
        );
        // Four levels match neither glob: the catch-all drops it.
        assert_eq!(
            m.map(
                "ratelimit.service.rate_limit.edge.a.b.c.total_hits",
                StatKind::Counter
            ),
            Mapped::Dropped
        );
        // match_metric_type counter does not take the timer.
        assert_eq!(
            m.map(
                "ratelimit_server.ShouldRateLimit.total_requests",
                StatKind::Observer
            ),
            Mapped::Dropped
        );
    }

    #[test]
    fn without_a_mapping_a_stat_keeps_its_escaped_name() {
        let m = StatsdMapping::parse("mappings: []\n").unwrap();
        assert_eq!(
            m.map("ratelimit.service.config_load_success", StatKind::Counter),
            Mapped::Series {
                name: "ratelimit_service_config_load_success".into(),
                labels: vec![],
            }
        );
    }

    #[test]
    fn a_file_it_cannot_honour_is_refused_with_the_mapping_named() {
        for (text, says) in [
            (
                "mappings:\n  - match: \"a.(\"\n    match_type: regex\n    name: x\n",
                "mapping 1",
            ),
            (
                "mappings:\n  - match: \"a.*\"\n    action: relabel\n    name: x\n",
                "relabel",
            ),
            ("mappings:\n  - match: \"a.*\"\n", "needs a name"),
            ("mappings: [", ""),
        ] {
            let error = StatsdMapping::parse(text).expect_err(text);
            assert!(error.contains(says), "{text}: {error}");
        }
    }
}
