//! Reading rule files: one directory, every non-dot regular file (or link to one) in it.
//! Kubernetes mounts a ConfigMap as `..data/` plus links; the dot entries are its machinery and are
//! skipped. All problems of all files are collected, so `portcullis check` lists every one.

use std::collections::HashMap;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use super::error::{RuleError, RulesError};
use super::{Domain, Snapshot, build, yaml};
use crate::algorithm::Algorithm;

/// Parses one file's text; on failure pushes the problems to `errors`.
pub fn parse_file(
    path: &Path,
    text: &str,
    options: LoadOptions,
    errors: &mut Vec<RuleError>,
) -> Option<Domain> {
    let file = Arc::new(path.to_path_buf());
    // The parser recurses per nesting level: its depth is bounded below what a thread's stack
    // holds (a crafted file must get an error, never overflow the stack).
    let mut budget = serde_saphyr::Budget::default();
    budget.max_depth = yaml::MAX_YAML_DEPTH;
    let parse_options = serde_saphyr::options! { budget: Some(budget) };
    match serde_saphyr::from_str_with_options::<yaml::FileYaml>(text, parse_options) {
        Ok(parsed) => build::build(&file, parsed, options.default_algorithm, errors),
        Err(e) => {
            let line = e.location().map_or(1, |l| l.line().max(1));
            let render = serde_saphyr::render_options! { snippets: serde_saphyr::SnippetMode::Off };
            let message = plain_message(&e.render_with_options(render));
            errors.push(RuleError {
                file: path.to_path_buf(),
                line,
                field: "yaml".into(),
                message,
            });
            None
        }
    }
}

/// The parser's message without what we already say (the location) or what only applies to
/// its API (the options hint).
fn plain_message(rendered: &str) -> String {
    let mut message = rendered.trim();
    if let Some(at) = message.rfind(" at line ") {
        message = &message[..at];
    }
    message
        .replace(", set DuplicateKeyPolicy in Options if acceptable", "")
        .trim_end_matches(',')
        .to_owned()
}

/// The rule files of a directory, sorted by name.
fn rule_files(dir: &Path) -> Result<Vec<PathBuf>, RulesError> {
    let read = std::fs::read_dir(dir).map_err(|source| RulesError::Dir {
        dir: dir.to_path_buf(),
        source,
    })?;
    let mut files = Vec::new();
    for entry in read {
        let entry = entry.map_err(|source| RulesError::Dir {
            dir: dir.to_path_buf(),
            source,
        })?;
        if entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        let path = entry.path();
        // `metadata` follows links, so a ConfigMap's link to `..data/file` counts as a file.
        if std::fs::metadata(&path).is_ok_and(|m| m.is_file()) {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

/// The bytes of every rule file of a directory, read once: what is fingerprinted is what is
/// parsed, so a file that changes between the two can never be half-seen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleFiles {
    /// (path, contents), sorted by path.
    pub files: Vec<(PathBuf, Vec<u8>)>,
}

impl RuleFiles {
    /// A hash of every file's name and contents: equal fingerprints, same rules.
    pub fn fingerprint(&self) -> u64 {
        let mut hasher = DefaultHasher::new();
        for (path, bytes) in &self.files {
            path.file_name().hash(&mut hasher);
            bytes.hash(&mut hasher);
        }
        hasher.finish()
    }
}

/// Reads every rule file of `dir` (a file that cannot be read is an error for the whole set).
pub fn read_dir(dir: &Path) -> Result<RuleFiles, RulesError> {
    let mut files = Vec::new();
    let mut errors = Vec::new();
    for path in rule_files(dir)? {
        match std::fs::read(&path) {
            Ok(bytes) => files.push((path, bytes)),
            Err(e) => errors.push(RuleError {
                file: path,
                line: 1,
                field: "file".into(),
                message: format!("cannot read: {e}"),
            }),
        }
    }
    if errors.is_empty() {
        Ok(RuleFiles { files })
    } else {
        Err(RulesError::Invalid(errors))
    }
}

/// How a set of files becomes one snapshot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoadOptions {
    /// A domain defined in several files is merged (the Go service's `MERGE_DOMAIN_CONFIG`);
    /// otherwise a second definition is an error.
    pub merge_domains: bool,
    /// The algorithm of a rule that does not name one (sliding window; the Go service's
    /// fixed window in its drop-in mode).
    pub default_algorithm: Algorithm,
}

/// Validates a set of rule files into a snapshot; all or nothing.
pub fn parse(set: &RuleFiles, options: LoadOptions) -> Result<Snapshot, RulesError> {
    let mut errors = Vec::new();
    let mut domains: HashMap<String, Domain> = HashMap::new();
    for (path, bytes) in &set.files {
        let text = match std::str::from_utf8(bytes) {
            Ok(text) => text,
            Err(e) => {
                errors.push(RuleError {
                    file: path.clone(),
                    line: 1,
                    field: "file".into(),
                    message: format!("cannot read: not UTF-8 text ({e})"),
                });
                continue;
            }
        };
        let Some(domain) = parse_file(path, text, options, &mut errors) else {
            continue;
        };
        if options.merge_domains
            && let Some(first) = domains.get_mut(&domain.name)
        {
            first.merge(domain, &mut errors);
            continue;
        }
        if let Some(first) = domains.get(&domain.name) {
            errors.push(RuleError {
                file: path.clone(),
                line: domain.source.line,
                field: "domain".into(),
                message: format!(
                    "domain {:?} is already defined in {} (merging a domain across files \
                     needs --merge-domain-config)",
                    domain.name, first.source
                ),
            });
            continue;
        }
        domains.insert(domain.name.clone(), domain);
    }
    if !errors.is_empty() {
        return Err(RulesError::Invalid(errors));
    }
    Ok(Snapshot {
        domains,
        loaded_at: SystemTime::now(),
        files: set.files.iter().map(|(path, _)| path.clone()).collect(),
        fingerprint: set.fingerprint(),
    })
}

/// Why a rules directory that loaded holds no domain, and where rules may be instead: a
/// directory one level down with YAML files in it (where the Go service's loader would look).
/// `None` when `snapshot` has a domain.
pub fn why_empty(dir: &Path, snapshot: &Snapshot) -> Option<String> {
    if !snapshot.domains.is_empty() {
        return None;
    }
    let yaml = |p: &Path| {
        p.extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("yaml") || e.eq_ignore_ascii_case("yml"))
    };
    let mut below: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir() && !is_hidden(p))
        .filter(|sub| {
            std::fs::read_dir(sub)
                .into_iter()
                .flatten()
                .flatten()
                .any(|e| yaml(&e.path()))
        })
        .map(|p| p.display().to_string())
        .collect();
    below.sort();
    let mut why = format!(
        "the rules directory {} holds no rules ({} file(s) read, no domain): every call would be \
         answered OK",
        dir.display(),
        snapshot.files.len()
    );
    if !below.is_empty() {
        why.push_str(&format!(
            "; YAML files are one level down, in {} (the directory is read flat: point the rules \
             directory there)",
            below.join(", ")
        ));
    }
    Some(why)
}

fn is_hidden(path: &Path) -> bool {
    path.file_name()
        .is_some_and(|n| n.to_string_lossy().starts_with('.'))
}

/// Reads and validates every rules file of `dir`; all or nothing.
pub fn load_dir(dir: &Path, options: LoadOptions) -> Result<Snapshot, RulesError> {
    parse(&read_dir(dir)?, options)
}
