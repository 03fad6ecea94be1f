//! The rules commands as the binary runs them (`check`, `explain`, `test`, `diff`): read the
//! files, run the review, print, and give the exit code (0 fine, 1 a failure or a change, 2
//! unusable input). Output goes to the writers handed in, so tests read it without a process.
//! It must never exit the process itself.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::Mode;
use super::diff;
use super::explain::{Call, explain as explain_call, render};
use super::report::{self, FileResults};
use super::run::{Bench, Outcome};
use super::spec::{self, TestFile};
use crate::rules::scaling::{self, Scaling};
use crate::rules::{self, LoadOptions};

pub const PASS: u8 = 0;
pub const FAIL: u8 = 1;
pub const UNUSABLE: u8 = 2;

/// `portcullis check DIR`.
pub fn check(
    dir: &Path,
    options: LoadOptions,
    allow_empty: bool,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> u8 {
    match rules::load_dir(dir, options) {
        Ok(snapshot) => {
            for warning in snapshot.warnings() {
                let _ = writeln!(err, "warning: {warning}");
            }
            if let Some(why) = rules::why_empty(dir, &snapshot) {
                if !allow_empty {
                    let _ = writeln!(err, "{why} (--allow-empty-rules passes it)");
                    return FAIL;
                }
                let _ = writeln!(err, "warning: {why}");
            }
            let _ = writeln!(
                out,
                "{}: {} file(s), {} domain(s), {} rule(s): OK",
                dir.display(),
                snapshot.files.len(),
                snapshot.domain_names().len(),
                snapshot.rules().len()
            );
            PASS
        }
        Err(e) => {
            let _ = writeln!(err, "{e}");
            FAIL
        }
    }
}

/// `portcullis explain`: the same explanation `test` checks.
pub fn explain(
    dir: &Path,
    call: &Call,
    mode: &Mode,
    scaling_file: Option<&Path>,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> u8 {
    let scaling = match scaling_file.map(read_scaling).transpose() {
        Ok(s) => s.unwrap_or_default(),
        Err(e) => {
            let _ = writeln!(err, "{e}");
            return FAIL;
        }
    };
    let _ = writeln!(err, "{}", mode.describe());
    let bench = match load(dir, mode) {
        Ok(b) => b,
        Err(e) => {
            let _ = writeln!(err, "{e}");
            return FAIL;
        }
    };
    let clock = crate::clock::ManualClock::new(super::run::SEQUENCE_START_US);
    let snapshot = bench.snapshot();
    match explain_call(&bench.decider(&scaling, &clock), &snapshot, call) {
        Ok(e) => {
            let _ = write!(out, "{}", render(&e, call, &snapshot, &scaling));
            PASS
        }
        Err(e) => {
            let _ = writeln!(err, "{e}");
            FAIL
        }
    }
}

fn read_scaling(path: &Path) -> Result<Scaling, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let file = scaling::parse_file(path, &text)?;
    Ok(Scaling {
        file,
        ..Scaling::default()
    })
}

fn load(dir: &Path, mode: &Mode) -> Result<Bench, String> {
    let snapshot = rules::load_dir(dir, mode.options).map_err(|e| e.to_string())?;
    Bench::with_service(Arc::new(snapshot), mode.service.clone())
        .map_err(|e| format!("cannot start the runtime: {e}"))
}

/// The test files named: files as given, directories' `.yaml`/`.yml` files (recursively, in
/// name order).
fn test_files(paths: &[PathBuf]) -> Result<Vec<PathBuf>, String> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), String> {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(|e| format!("{}: {e}", dir.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                !p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with('.'))
            })
            .collect();
        entries.sort();
        for path in entries {
            if path.is_dir() {
                walk(&path, out)?;
            } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
                out.push(path);
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    for path in paths {
        if path.is_dir() {
            walk(path, &mut out)?;
        } else {
            out.push(path.clone());
        }
    }
    if out.is_empty() {
        return Err("no test files found (a test file is a .yaml or .yml file)".into());
    }
    Ok(out)
}

/// Reads and checks every test file and its scaling file; all problems at once.
fn read_tests(paths: &[PathBuf]) -> Result<Vec<(TestFile, Scaling)>, Vec<String>> {
    let files = test_files(paths).map_err(|e| vec![e])?;
    let mut out = Vec::new();
    let mut problems = Vec::new();
    for path in files {
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) => {
                problems.push(format!("{}:1: cannot read: {e}", path.display()));
                continue;
            }
        };
        match spec::parse(&path, &text) {
            Err(errors) => problems.extend(errors.iter().map(ToString::to_string)),
            Ok(file) => {
                let scaling = match &file.scaling {
                    None => Scaling::default(),
                    Some((scaling_path, line)) => match read_scaling(scaling_path) {
                        Ok(s) => s,
                        Err(e) => {
                            problems.push(format!("{}:{line}: scaling: {e}", path.display()));
                            continue;
                        }
                    },
                };
                out.push((file, scaling));
            }
        }
    }
    if problems.is_empty() {
        Ok(out)
    } else {
        Err(problems)
    }
}

/// `portcullis test RULES TESTS... [--junit FILE]`.
pub fn test(
    dir: &Path,
    tests: &[PathBuf],
    mode: &Mode,
    junit: Option<&Path>,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> u8 {
    let _ = writeln!(err, "{}", mode.describe());
    let bench = match load(dir, mode) {
        Ok(b) => b,
        Err(e) => {
            let _ = writeln!(err, "{e}");
            return UNUSABLE;
        }
    };
    let files = match read_tests(tests) {
        Ok(f) => f,
        Err(problems) => {
            for p in problems {
                let _ = writeln!(err, "{p}");
            }
            return UNUSABLE;
        }
    };
    let results: Vec<FileResults<'_>> = files
        .iter()
        .map(|(file, scaling)| FileResults {
            path: &file.path,
            outcomes: bench.run_file(file, scaling),
        })
        .collect();
    let _ = write!(out, "{}", report::text(&results));
    if let Some(path) = junit
        && let Err(e) = std::fs::write(path, report::junit(&results))
    {
        let _ = writeln!(err, "cannot write {}: {e}", path.display());
        return UNUSABLE;
    }
    let failed = results
        .iter()
        .flat_map(|f| &f.outcomes)
        .any(|o| o.failure.is_some());
    if failed { FAIL } else { PASS }
}

/// The rule a case's descriptor meets: its path, where it is written, what it is.
#[derive(Debug, Clone, serde::Serialize)]
struct Met {
    rule: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    at: Option<String>,
    is: String,
}

/// One case whose descriptor meets another rule, or whose outcome changes, between two sets.
#[derive(Debug, serde::Serialize)]
struct CaseChange {
    at: String,
    case: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    rule_before: Option<Met>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rule_after: Option<Met>,
    passes_before: bool,
    passes_after: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    failure_after: Option<String>,
}

/// `portcullis diff OLD NEW [--tests TESTS...] [--json]`.
pub fn diff(
    old: &Path,
    new: &Path,
    tests: &[PathBuf],
    mode: &Mode,
    json: bool,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> u8 {
    // JSON carries it in the document, for tools that read both streams as one.
    if !json {
        let _ = writeln!(err, "{}", mode.describe());
    }
    let loaded = load(old, mode).and_then(|o| Ok((o, load(new, mode)?)));
    let (before, after) = match loaded {
        Ok(pair) => pair,
        Err(e) => {
            let _ = writeln!(err, "{e}");
            return UNUSABLE;
        }
    };
    let files = if tests.is_empty() {
        Vec::new()
    } else {
        match read_tests(tests) {
            Ok(f) => f,
            Err(problems) => {
                for p in problems {
                    let _ = writeln!(err, "{p}");
                }
                return UNUSABLE;
            }
        }
    };
    let changes = diff::rules(&before.snapshot(), &after.snapshot());
    let cases = case_changes(&before, &after, &files);
    if json {
        let doc = serde_json::json!({ "rules": changes, "cases": cases, "mode": mode.describe() });
        let _ = writeln!(out, "{doc:#}");
    } else {
        let _ = write!(out, "{}", diff::text(&changes));
        for c in &cases {
            let rule = match (&c.rule_before, &c.rule_after) {
                (Some(a), Some(b)) if a.rule == b.rule && a.is == b.is => String::new(),
                (Some(a), Some(b)) if a.rule == b.rule => {
                    format!(": its rule {} changes: {} -> {}", a.rule, a.is, b.is)
                }
                (None, None) => String::new(),
                (a, b) => {
                    let show = |m: &Option<Met>| {
                        m.as_ref()
                            .map_or("no rule".to_owned(), |m| format!("{} ({})", m.rule, m.is))
                    };
                    format!(": meets {} -> {}", show(a), show(b))
                }
            };
            let outcome = match (c.passes_before, c.passes_after, &c.failure_after) {
                (true, false, Some(f)) => format!("; now fails: {f}"),
                (false, true, _) => "; now passes".into(),
                _ => String::new(),
            };
            let _ = writeln!(out, "{}: case {:?}{rule}{outcome}", c.at, c.case);
        }
        let _ = writeln!(
            out,
            "{} rule change(s), {} test case(s) affected",
            changes.len(),
            cases.len()
        );
    }
    if changes.is_empty() && cases.is_empty() {
        PASS
    } else {
        FAIL
    }
}

/// The cases whose descriptor meets a different rule (or the same rule, changed), or whose
/// outcome changes.
fn case_changes(before: &Bench, after: &Bench, files: &[(TestFile, Scaling)]) -> Vec<CaseChange> {
    let met = |bench: &Bench, case: &spec::Case, scaling: &Scaling| -> Option<Met> {
        let clock = crate::clock::ManualClock::new(super::run::SEQUENCE_START_US);
        let call = Call {
            domain: case.domain.clone(),
            descriptor: case.descriptor.clone(),
            limit: case.limit,
            also: case.also.clone(),
            ..Call::default()
        };
        let snapshot = bench.snapshot();
        let e = explain_call(&bench.decider(scaling, &clock), &snapshot, &call).ok()?;
        e.rule().map(|r| Met {
            rule: r.full_key.clone(),
            at: r.source.as_ref().map(ToString::to_string),
            is: diff::summary(r),
        })
    };
    // A rule moved in its file is not a change: compare what it is, not where.
    let what = |m: &Option<Met>| m.as_ref().map(|m| (m.rule.clone(), m.is.clone()));
    let mut out = Vec::new();
    for (file, scaling) in files {
        for case in &file.cases {
            let (rb, ra) = (met(before, case, scaling), met(after, case, scaling));
            let ob: Outcome = before.run_case(case, scaling);
            let oa: Outcome = after.run_case(case, scaling);
            let (pb, pa) = (ob.failure.is_none(), oa.failure.is_none());
            let rule_changed = what(&rb) != what(&ra);
            if rule_changed || pb != pa {
                out.push(CaseChange {
                    at: format!("{}:{}", file.path.display(), case.line),
                    case: case.name.clone(),
                    rule_before: rb,
                    rule_after: ra,
                    passes_before: pb,
                    passes_after: pa,
                    failure_after: oa.failure,
                });
            }
        }
    }
    out
}
