//! The bodies of the fuzz targets, shared by `cargo fuzz` (`fuzz/fuzz_targets/`, libFuzzer) and by
//! `cargo test` (`tests/local/fuzz.rs`: every committed corpus file replayed, then proptest inputs), so
//! the corpus is exercised on any toolchain.
//!
//! Each body takes any bytes and must never panic, hang or allocate without bound; where the
//! input is accepted, it also checks what a caller relies on (one status per descriptor, a
//! remaining count never above the limit, a snapshot that answers every lookup).
#![allow(dead_code)]

use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use arc_swap::ArcSwap;
use portcullis::algorithm::Algorithm;
use portcullis::clock::ManualClock;
use portcullis::limiter::Limiter;
use portcullis::pb::{RateLimitRequest, rate_limit_descriptor};
use portcullis::rules::{self, LoadOptions, Snapshot};
use portcullis::service::{Decider, ServiceConfig, json};
use portcullis::store::MemoryStore;
use portcullis::telemetry::Metrics;
use prost::Message;

/// The rules the request targets decide against: every algorithm, nesting, wildcards, shared
/// wildcards, unlimited, shadow, replaces, quota, layers.
pub const RULES: &str = r#"
domain: fz
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: b
    rate_limit: {unit: minute, requests_per_unit: 5, algorithm: token_bucket}
    descriptors:
      - key: c
        value: x*
        rate_limit: {unit: hour, requests_per_unit: 2, algorithm: fixed_window}
  - key: d
    value: "*"
    share_threshold: true
    rate_limit: {unit: day, requests_per_unit: 1}
  - key: e
    rate_limit: {unlimited: true}
  - key: s
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: r
    rate_limit: {name: rr, unit: minute, requests_per_unit: 4, replaces: [{name: other}]}
  - key: q
    quota_mode: true
    rate_limit: {name: other, unit: week, requests_per_unit: 7}
  - key: l
    rate_limits:
      - {name: burst, unit: second, requests_per_unit: 2, algorithm: token_bucket, burst: 4}
      - {name: rr, unit: hour, requests_per_unit: 9}
      - {unit: hour, requests_per_unit: 5, algorithm: fixed_window}
"#;

/// The largest `burst` in `RULES`: the most a status may report remaining above its rate.
const LARGEST_BURST: u32 = 4;

/// Counters the request targets' store may hold: bounded across millions of inputs.
const MAX_COUNTERS: usize = 4096;

struct World {
    runtime: tokio::runtime::Runtime,
    decider: Decider,
    clock: ManualClock,
}

fn world() -> &'static World {
    static WORLD: OnceLock<World> = OnceLock::new();
    WORLD.get_or_init(|| {
        let files = rules::RuleFiles {
            files: vec![("fz.yaml".into(), RULES.as_bytes().to_vec())],
        };
        let snapshot = rules::parse(&files, LoadOptions::default()).expect("the fuzz rules load");
        let clock = ManualClock::new(1_762_992_000_000_000);
        let store = MemoryStore::with_max_counters(Arc::new(clock.clone()), MAX_COUNTERS);
        let metrics = Arc::new(Metrics::new(0.8, 64));
        let limiter = Arc::new(Limiter::new(Box::new(store), metrics.clone()));
        let config = ServiceConfig {
            max_descriptors: 16,
            max_entries: 8,
            max_string_bytes: 256,
            ..ServiceConfig::default()
        };
        let decider = Decider::new(
            Arc::new(ArcSwap::from_pointee(snapshot)),
            limiter,
            config,
            metrics,
        );
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        World {
            runtime,
            decider,
            clock,
        }
    })
}

/// Bytes taken off the front of the input, zeros once it runs out.
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn byte(&mut self) -> u8 {
        match self.0.split_first() {
            Some((b, rest)) => {
                self.0 = rest;
                *b
            }
            None => 0,
        }
    }
    fn u64(&mut self) -> u64 {
        (0..8).fold(0, |acc, _| (acc << 8) | u64::from(self.byte()))
    }
    /// A short string: a name from the rules most of the time, else raw (maybe odd) text.
    fn text(&mut self, names: &[&str]) -> String {
        let pick = self.byte();
        if usize::from(pick) < names.len() * 24 {
            return names[usize::from(pick) % names.len()].to_owned();
        }
        let len = usize::from(self.byte() % 48);
        let raw: Vec<u8> = (0..len).map(|_| self.byte()).collect();
        String::from_utf8_lossy(&raw).into_owned()
    }
}

const KEYS: &[&str] = &["a", "b", "c", "d", "e", "s", "r", "q", "l", "zz"];
const VALUES: &[&str] = &["", "x", "x1", "xyz", "1", "%7B", "{fz|a=1}", "\u{0}"];

/// A request built field by field from the bytes: the shapes a decoder would seldom reach.
fn structured(input: &mut Bytes) -> RateLimitRequest {
    let mut request = RateLimitRequest {
        domain: input.text(&["fz", "fz", "other", ""]),
        descriptors: Vec::new(),
        hits_addend: match input.byte() % 4 {
            0 => 0,
            1 => u32::from(input.byte()),
            2 => u32::MAX,
            _ => input.u64() as u32,
        },
    };
    for _ in 0..input.byte() % 6 {
        let entries = (0..input.byte() % 4)
            .map(|_| rate_limit_descriptor::Entry {
                key: input.text(KEYS),
                value: input.text(VALUES),
            })
            .collect();
        let limit =
            input
                .byte()
                .is_multiple_of(4)
                .then(|| rate_limit_descriptor::RateLimitOverride {
                    requests_per_unit: match input.byte() % 3 {
                        0 => 0,
                        1 => u32::from(input.byte()),
                        _ => u32::MAX,
                    },
                    unit: i32::from(input.byte() as i8),
                });
        let hits_addend = match input.byte() % 4 {
            0 => None,
            1 => Some(u64::from(input.byte())),
            2 => Some(u64::MAX),
            _ => Some(input.u64()),
        };
        request
            .descriptors
            .push(portcullis::pb::RateLimitDescriptor {
                entries,
                limit,
                hits_addend,
                is_negative_hits: input.byte().is_multiple_of(5),
            });
    }
    request
}

/// Decides `request` and holds the answer to its contract.
fn decide(request: &RateLimitRequest, advance_us: u64) {
    let world = world();
    world.clock.advance_us(advance_us);
    let answer = world
        .runtime
        .block_on(async {
            tokio::time::timeout(Duration::from_secs(5), world.decider.decide(request)).await
        })
        .expect("a decision never hangs");
    if let Ok(response) = answer {
        assert_eq!(
            response.statuses.len(),
            request.descriptors.len(),
            "one status per descriptor"
        );
        for status in &response.statuses {
            if let Some(limit) = &status.current_limit {
                // A token bucket may hold its burst, above its rate.
                assert!(
                    status.limit_remaining <= limit.requests_per_unit.max(LARGEST_BURST),
                    "remaining {} above the limit {}",
                    status.limit_remaining,
                    limit.requests_per_unit
                );
            }
        }
    }
}

/// Any bytes as a `RateLimitRequest`: half the time protobuf-decoded (what tonic hands the
/// service), half the time built field by field; decided on the memory store.
pub fn request(data: &[u8]) {
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    let mut input = Bytes(rest);
    let advance_us = u64::from(input.byte()) * 100_000;
    let request = if first % 2 == 0 {
        match RateLimitRequest::decode(input.0) {
            Ok(request) => request,
            Err(_) => return,
        }
    } else {
        structured(&mut input)
    };
    decide(&request, advance_us);
}

/// Any bytes as the admin `/json` body: parsed, decided, and the answer written back as JSON
/// that parses.
pub fn json(data: &[u8]) {
    let Ok(request) = json::request_from_json(data) else {
        return;
    };
    decide(&request, 0);
    let world = world();
    if let Ok(Ok(response)) = world.runtime.block_on(async {
        tokio::time::timeout(Duration::from_secs(5), world.decider.decide(&request)).await
    }) {
        let text = json::response_to_json(&response);
        serde_json::from_str::<serde_json::Value>(&text).expect("the answer is JSON");
    }
}

/// Any bytes as one rules file, loaded both ways (merged domains or not, each default
/// algorithm); an accepted set answers lookups and describes every rule.
pub fn rules_file(data: &[u8]) {
    let files = rules::RuleFiles {
        files: vec![("fuzz.yaml".into(), data.to_vec())],
    };
    check_set(&files);
}

/// Any bytes as a directory: up to 6 entries `name 0x00 contents` separated by 0xFF; names may
/// nest (`a/b.yaml`), start with a dot, or start with `@` to be a link to the entry before (as
/// a ConfigMap lays its files out). Written to a temporary directory and read like the rules
/// directory.
pub fn rules_dir(data: &[u8]) {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut previous: Option<std::path::PathBuf> = None;
    for entry in data.split(|b| *b == 0xFF).take(6) {
        let (name, contents) = match entry.iter().position(|b| *b == 0) {
            Some(at) => (&entry[..at], &entry[at + 1..]),
            None => (entry, &[][..]),
        };
        let name: String = String::from_utf8_lossy(name)
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '/' | '@'))
            .take(40)
            .collect();
        let name = name.trim_start_matches('/');
        // No way out of the directory, and no part that cannot be a file name.
        if name.is_empty() || name.split('/').any(|part| part.is_empty() || part == "..") {
            continue;
        }
        let (link, name) = match name.strip_prefix('@') {
            Some(rest) if !rest.is_empty() => (true, rest),
            _ => (false, name),
        };
        let path = dir.path().join(name);
        if let Some(parent) = path.parent() {
            let _ = std::fs::create_dir_all(parent);
        }
        match (link, &previous) {
            (true, Some(target)) => {
                let _ = std::os::unix::fs::symlink(target, &path);
            }
            _ => {
                let _ = std::fs::write(&path, contents);
            }
        }
        previous = Some(path);
    }
    if let Ok(files) = rules::read_dir(dir.path()) {
        check_set(&files);
    }
}

/// One of the four loading options per input, chosen by its length (no byte of the input is
/// spent on it, so the corpus means what it meant): each option is met by mutations within a
/// few steps, and an input costs one parse instead of four. Four parses made a rules input cost
/// ~45 ms in the instrumented build, and CI's 20 s passes ended before the committed corpus was
/// even loaded: replayed, never fuzzed.
fn check_set(files: &rules::RuleFiles) {
    let length: usize = files.files.iter().map(|(_, bytes)| bytes.len()).sum();
    let options = LoadOptions {
        merge_domains: length & 1 == 1,
        default_algorithm: if length & 2 == 2 {
            Algorithm::FixedWindow
        } else {
            Algorithm::SlidingWindow
        },
    };
    match rules::parse(files, options) {
        Ok(snapshot) => exercise(&snapshot),
        Err(error) => {
            // The error names what is wrong: never empty.
            assert!(!error.to_string().trim().is_empty());
        }
    }
}

/// An accepted snapshot resolves any lookup and describes every rule.
fn exercise(snapshot: &Snapshot) {
    for rule in snapshot.rules() {
        let _ = rule.describe();
    }
    let _ = snapshot.warnings();
    for domain in snapshot.domain_names() {
        for path in snapshot.rule_key_paths(domain) {
            let entries: Vec<rate_limit_descriptor::Entry> = path
                .iter()
                .map(|key| rate_limit_descriptor::Entry {
                    key: key.clone(),
                    value: "v".into(),
                })
                .collect();
            let _ = snapshot.resolve(domain, &entries);
            let _ = snapshot.explain(domain, &entries);
        }
    }
}

/// The committed corpus of `target` (`fuzz/corpus/<target>/`), for replays.
pub fn corpus(root: &Path, target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = root.join("fuzz").join("corpus").join(target);
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(Result::ok)
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).expect("read corpus file"),
            )
        })
        .collect();
    files.sort();
    files
}
