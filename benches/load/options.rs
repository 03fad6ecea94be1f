//! The load benchmark's command line: which stores, scenarios and builds, for how long.
//! It must never guess at a malformed flag: it stops with the flag named.

use super::*;

pub struct Options {
    pub full: bool,
    pub seconds: f64,
    pub connections: usize,
    pub streams: usize,
    pub only: Option<Vec<String>>,
    /// Only the scenarios whose label contains this.
    pub scenario: Option<String>,
    /// The builds measured: this one first, then each `--compare LABEL=PATH`.
    pub binaries: Vec<(String, PathBuf)>,
    /// How many times each scenario is measured, the builds in turn each time.
    pub rounds: usize,
    /// `--generator h2load`: h2load drives the unpaced rows of one request shape.
    pub h2load: bool,
}

/// This build, then every `--compare LABEL=PATH`.
pub fn binaries(args: &[String]) -> Vec<(String, PathBuf)> {
    let mut out = vec![(
        "this build".to_owned(),
        PathBuf::from(env!("CARGO_BIN_EXE_portcullis")),
    )];
    for (i, arg) in args.iter().enumerate() {
        if arg != "--compare" {
            continue;
        }
        let given = args.get(i + 1).expect("--compare LABEL=PATH");
        let (label, path) = given
            .split_once('=')
            .unwrap_or_else(|| panic!("--compare {given:?}: want LABEL=PATH"));
        let path = PathBuf::from(path);
        assert!(path.is_file(), "--compare {label}: no file at {path:?}");
        out.push((label.to_owned(), path));
    }
    out
}

impl Options {
    pub fn parse() -> Options {
        let args: Vec<String> = std::env::args().collect();
        let full = args.iter().any(|a| a == "--bench");
        let value = |name: &str| {
            args.iter()
                .position(|a| a == name)
                .and_then(|i| args.get(i + 1).cloned())
        };
        Options {
            full,
            seconds: value("--seconds")
                .and_then(|v| v.parse().ok())
                .unwrap_or(if full { 8.0 } else { 0.3 }),
            connections: value("--connections")
                .and_then(|v| v.parse().ok())
                .unwrap_or(4),
            streams: value("--streams")
                .and_then(|v| v.parse().ok())
                .unwrap_or(32),
            only: value("--only").map(|v| v.split(',').map(str::to_owned).collect()),
            scenario: value("--scenario"),
            binaries: binaries(&args),
            rounds: value("--rounds")
                .and_then(|v| v.parse().ok())
                .unwrap_or(1)
                .max(1),
            h2load: match value("--generator").as_deref() {
                None | Some("tonic") => false,
                Some("h2load") => true,
                Some(other) => panic!("--generator {other:?}: tonic or h2load"),
            },
        }
    }

    pub fn wants(&self, store: &str) -> bool {
        self.only
            .as_ref()
            .is_none_or(|only| only.iter().any(|o| o == store))
    }

    /// Whether `--only` names `store` (the rows not run by default).
    pub fn names(&self, store: &str) -> bool {
        self.only
            .as_ref()
            .is_some_and(|only| only.iter().any(|o| o == store))
    }
}
