//! A rules test file: what a platform engineer writes (cases that say which rule a descriptor
//! meets, and sequences of hits on a virtual clock with the answers expected), parsed and checked
//! into plain cases. Unknown or duplicate keys and bad values are refused with the file and line;
//! it must never run anything or half-accept a file.

use std::path::{Path, PathBuf};

use serde_saphyr::Spanned;

use super::spec_yaml::{CaseYaml, ExpectYaml, FileYaml, StepYaml};
use super::values::{parse_entry, parse_rate, parse_time_us};
use crate::algorithm::Algorithm;
use crate::rules::Unit;

/// The most calls one step may repeat, and steps one case may hold: a test file is input too.
pub const MAX_REPEAT: u32 = 100_000;
pub const MAX_STEPS: usize = 10_000;
/// The most calls one case may make in all (each is a decision through the serving code).
pub const MAX_CALLS: u64 = 1_000_000;

/// A test file, checked.
#[derive(Debug, Clone)]
pub struct TestFile {
    pub path: PathBuf,
    /// The scaling file its cases run under (as `serve --scaling-file`), resolved against the
    /// test file's folder, and the line naming it.
    pub scaling: Option<(PathBuf, u64)>,
    pub cases: Vec<Case>,
}

/// One case: a call (a descriptor, maybe others beside it) and what must hold of it.
#[derive(Debug, Clone)]
pub struct Case {
    pub line: u64,
    pub name: String,
    pub domain: String,
    pub descriptor: Vec<(String, String)>,
    /// The limit the descriptor itself carries (Envoy's override).
    pub limit: Option<(u32, Unit)>,
    /// Other descriptors of the same call (their `replaces` may drop this one's limit).
    pub also: Vec<Vec<(String, String)>>,
    pub expect: Option<Expect>,
    pub steps: Vec<Step>,
}

/// What the descriptor must match; every field left out is not checked.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Expect {
    pub line: u64,
    /// A rule's name, or its path as envoyproxy/ratelimit names it (`path_/api/login`, with or
    /// without the domain in front).
    pub rule: Option<String>,
    pub no_rule: Option<bool>,
    pub limit: Option<(u32, Unit)>,
    pub algorithm: Option<Algorithm>,
    pub burst: Option<u64>,
    pub layers: Option<Vec<ExpectLayer>>,
    pub shadow: Option<bool>,
    pub quota: Option<bool>,
    pub post_paid: Option<bool>,
    pub unlimited: Option<bool>,
    pub replaced: Option<bool>,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct ExpectLayer {
    pub line: u64,
    pub name: Option<String>,
    pub limit: Option<(u32, Unit)>,
    pub algorithm: Option<Algorithm>,
    pub burst: Option<u64>,
}

/// One step of a sequence: `repeat` identical calls at `at_us` after the sequence's start.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub line: u64,
    pub at_us: u64,
    /// The descriptor's `hits_addend` (0: check only); `None` sends none (one hit).
    pub hits: Option<u32>,
    /// The hits are given back (`is_negative_hits`).
    pub refund: bool,
    pub repeat: u32,
    /// Every call's answer for the descriptor: `true` OK, `false` OVER_LIMIT.
    pub expect_ok: Option<bool>,
    /// How many of the repeated calls are admitted.
    pub allowed: Option<u32>,
    /// After the last call: `limit_remaining`, `duration_until_reset` (whole seconds, as sent),
    /// the limit reported and its name.
    pub remaining: Option<u32>,
    pub reset_s: Option<u64>,
    pub limit: Option<(u32, Unit)>,
    pub binding: Option<String>,
}

/// A test file that cannot be used, with where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}:{line}: {message}", file.display())]
pub struct SpecError {
    pub file: PathBuf,
    pub line: u64,
    pub message: String,
}

/// Parses and checks one test file; every problem found is returned.
pub fn parse(path: &Path, text: &str) -> Result<TestFile, Vec<SpecError>> {
    let mut errors = Vec::new();
    let error = |errors: &mut Vec<SpecError>, line: u64, message: String| {
        errors.push(SpecError {
            file: path.to_path_buf(),
            line,
            message,
        })
    };
    let file: FileYaml = match serde_saphyr::from_str(text) {
        Ok(file) => file,
        Err(e) => {
            let line = e.location().map_or(1, |l| l.line().max(1));
            let render = serde_saphyr::render_options! { snippets: serde_saphyr::SnippetMode::Off };
            let mut message = e.render_with_options(render);
            if let Some(at) = message.rfind(" at line ") {
                message.truncate(at);
            }
            error(&mut errors, line, message.trim().to_owned());
            return Err(errors);
        }
    };
    let scaling = file.scaling.map(|s| {
        let named = PathBuf::from(&s.value);
        let resolved = match path.parent() {
            Some(dir) if named.is_relative() => dir.join(named),
            _ => named,
        };
        (resolved, s.referenced.line())
    });
    let Some(cases) = file.cases.filter(|c| !c.is_empty()) else {
        error(&mut errors, 1, "`cases` must list at least one case".into());
        return Err(errors);
    };
    let mut out = Vec::new();
    let mut names: Vec<(String, u64)> = Vec::new();
    for spanned in cases {
        let line = spanned.referenced.line();
        let mut problems = Vec::new();
        let case = case(line, spanned.value, file.domain.as_deref(), &mut problems);
        for (at, message) in problems {
            error(&mut errors, at, message);
        }
        let Some(case) = case else { continue };
        if let Some((_, first)) = names.iter().find(|(n, _)| *n == case.name) {
            error(
                &mut errors,
                line,
                format!("case {:?} is named at line {first} already", case.name),
            );
            continue;
        }
        names.push((case.name.clone(), line));
        out.push(case);
    }
    if errors.is_empty() {
        Ok(TestFile {
            path: path.to_path_buf(),
            scaling,
            cases: out,
        })
    } else {
        Err(errors)
    }
}

type Problems = Vec<(u64, String)>;

/// The value, or `None` with the problem recorded against `what` at `line`.
fn take<T>(problems: &mut Problems, line: u64, what: &str, parsed: Result<T, String>) -> Option<T> {
    parsed
        .map_err(|m| problems.push((line, format!("`{what}`: {m}"))))
        .ok()
}

fn case(
    line: u64,
    c: CaseYaml,
    file_domain: Option<&str>,
    problems: &mut Problems,
) -> Option<Case> {
    let before = problems.len();
    let name = c.name.filter(|n| !n.trim().is_empty());
    if name.is_none() {
        problems.push((line, "a case needs a `name`".into()));
    }
    let domain = c.domain.or(file_domain.map(str::to_owned));
    if domain.is_none() {
        problems.push((
            line,
            "no `domain`: give one for the file or the case".into(),
        ));
    }
    let entries = |list: Vec<String>, what: &str, problems: &mut Problems| {
        if list.is_empty() {
            problems.push((line, format!("`{what}` must list at least one key=value")));
        }
        list.iter()
            .filter_map(|e| take(problems, line, what, parse_entry(e)))
            .collect::<Vec<_>>()
    };
    let descriptor = match c.descriptor {
        Some(list) => entries(list, "descriptor", problems),
        None => {
            problems.push((
                line,
                "a case needs a `descriptor` (a list of key=value)".into(),
            ));
            Vec::new()
        }
    };
    let also = c
        .also
        .unwrap_or_default()
        .into_iter()
        .map(|d| entries(d, "also", problems))
        .collect();
    let limit = c
        .limit
        .and_then(|l| take(problems, line, "limit", parse_rate(&l)));
    let expect = c
        .expect
        .map(|e| expect(e.referenced.line(), e.value, problems));
    let steps = steps(c.steps.unwrap_or_default(), problems);
    let calls: u64 = steps.iter().map(|s| u64::from(s.repeat)).sum();
    if calls > MAX_CALLS {
        problems.push((
            line,
            format!("the steps make {calls} calls, more than the {MAX_CALLS} a case may make"),
        ));
    }
    if expect.is_none() && steps.is_empty() {
        problems.push((line, "a case needs `expect`, `steps`, or both".into()));
    }
    if problems.len() > before {
        return None;
    }
    Some(Case {
        line,
        name: name?,
        domain: domain?,
        descriptor,
        limit,
        also,
        expect,
        steps,
    })
}

fn algorithm(text: &str) -> Result<Algorithm, String> {
    match text {
        "sliding_window" => Ok(Algorithm::SlidingWindow),
        "token_bucket" => Ok(Algorithm::TokenBucket),
        "fixed_window" => Ok(Algorithm::FixedWindow),
        "concurrency" => Ok(Algorithm::Concurrency),
        other => Err(format!(
            "{other:?} is not sliding_window, token_bucket, fixed_window or concurrency"
        )),
    }
}

fn expect(line: u64, e: ExpectYaml, problems: &mut Problems) -> Expect {
    let limit = e
        .limit
        .and_then(|t| take(problems, line, "expect.limit", parse_rate(&t)));
    let layers = e.layers.map(|list| {
        list.into_iter()
            .map(|spanned| (spanned.referenced.line(), spanned.value))
            .map(|(line, l)| ExpectLayer {
                line,
                name: l.name,
                limit: l
                    .limit
                    .and_then(|t| take(problems, line, "expect.layers.limit", parse_rate(&t))),
                algorithm: l
                    .algorithm
                    .and_then(|a| take(problems, line, "expect.layers.algorithm", algorithm(&a))),
                burst: l.burst,
            })
            .collect()
    });
    let algorithm = e
        .algorithm
        .and_then(|a| take(problems, line, "expect.algorithm", algorithm(&a)));
    if e.no_rule == Some(true) && (e.rule.is_some() || limit.is_some() || e.unlimited == Some(true))
    {
        problems.push((
            line,
            "`expect.no_rule: true` contradicts `rule`, `limit` or `unlimited`".into(),
        ));
    }
    Expect {
        line,
        rule: e.rule,
        no_rule: e.no_rule,
        limit,
        algorithm,
        burst: e.burst,
        layers,
        shadow: e.shadow,
        quota: e.quota,
        post_paid: e.post_paid,
        unlimited: e.unlimited,
        replaced: e.replaced,
    }
}

fn steps(list: Vec<Spanned<StepYaml>>, problems: &mut Problems) -> Vec<Step> {
    if list.len() > MAX_STEPS {
        let line = list[0].referenced.line();
        problems.push((line, format!("more than {MAX_STEPS} steps in one case")));
        return Vec::new();
    }
    let mut out = Vec::new();
    let mut now_us = 0u64;
    for spanned in list {
        let line = spanned.referenced.line();
        let s = spanned.value;
        match (&s.at, &s.after) {
            (Some(_), Some(_)) => problems.push((line, "give `at` or `after`, not both".into())),
            (Some(at), None) => {
                if let Some(at) = take(problems, line, "at", parse_time_us(at)) {
                    if at < now_us {
                        problems.push((
                            line,
                            format!(
                                "`at: {at_text}` is before the previous step ({:.3}s): the clock only moves forward",
                                now_us as f64 / 1e6,
                                at_text = s.at.as_deref().unwrap_or_default()
                            ),
                        ));
                    }
                    now_us = now_us.max(at);
                }
            }
            (None, Some(after)) => {
                if let Some(after) = take(problems, line, "after", parse_time_us(after)) {
                    now_us = now_us.saturating_add(after);
                }
            }
            (None, None) => {}
        }
        let reset_s = s
            .reset
            .as_deref()
            .and_then(|r| take(problems, line, "reset", parse_time_us(r)))
            .map(|us| us.div_ceil(1_000_000));
        let expect_ok = match s.expect.as_deref() {
            None => None,
            Some("ok" | "OK") => Some(true),
            Some("over_limit" | "OVER_LIMIT") => Some(false),
            Some(other) => {
                problems.push((line, format!("`expect`: {other:?} is not ok or over_limit")));
                None
            }
        };
        let limit = s
            .limit
            .as_deref()
            .and_then(|l| take(problems, line, "limit", parse_rate(l)));
        if s.hits.is_some() && s.refund.is_some() {
            problems.push((line, "give `hits` or `refund`, not both".into()));
        }
        let repeat = s.repeat.unwrap_or(1);
        if repeat == 0 || repeat > MAX_REPEAT {
            problems.push((line, format!("`repeat` must be 1 to {MAX_REPEAT}")));
        }
        if s.allowed.is_some_and(|a| a > repeat) {
            problems.push((
                line,
                format!("`allowed` is more than the {repeat} call(s) made"),
            ));
        }
        out.push(Step {
            line,
            at_us: now_us,
            hits: s.hits.or(s.refund),
            refund: s.refund.is_some(),
            repeat,
            expect_ok,
            allowed: s.allowed,
            remaining: s.remaining,
            reset_s,
            limit,
            binding: s.binding,
        });
    }
    out
}
