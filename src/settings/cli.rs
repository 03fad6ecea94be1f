//! The command line: the subcommands and their own arguments (`serve` takes every `Settings`
//! flag). It must never read a setting's value itself: clap parses, `Settings` holds.

use std::path::PathBuf;

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

use super::{Decisions, Settings, Sources};

#[derive(Parser)]
#[command(
    name = "portcullis",
    version,
    about = "Rate-limit service for Envoy and Istio"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Serve envoy.service.ratelimit.v3 over gRPC, and the admin HTTP listener.
    Serve(Box<Settings>),
    /// Validate a rules directory; exit 1 listing every problem.
    Check {
        /// The rules directory (or `--config DIR`, as `serve` takes it).
        #[arg(required_unless_present = "config", conflicts_with = "config")]
        dir: Option<PathBuf>,
        /// The rules directory, as `serve --config` takes it.
        #[arg(long, env = "PORTCULLIS_CONFIG")]
        config: Option<PathBuf>,
        /// Merge a domain defined in several files (as `serve --merge-domain-config`).
        #[arg(long, env = "PORTCULLIS_MERGE_DOMAIN_CONFIG")]
        merge_domain_config: bool,
        /// Pass a directory that holds no rules (as `serve --allow-empty-rules`).
        #[arg(long, env = "PORTCULLIS_ALLOW_EMPTY_RULES")]
        allow_empty_rules: bool,
    },
    /// Show which rule a descriptor matches, level by level, and why.
    Explain {
        /// The rules directory (as `serve --config`).
        #[arg(long, env = "PORTCULLIS_CONFIG")]
        config: PathBuf,
        /// The descriptor's domain.
        #[arg(long)]
        domain: String,
        /// The descriptor's entries in order, as key=value (key= for an empty value).
        #[arg(required = true, value_parser = parse_entry)]
        entries: Vec<(String, String)>,
        /// A limit the descriptor carries itself, as 5/minute (Envoy's override: a route's
        /// `rate_limits[].limit`, or the ratelimit filter's own): what replaces the rule.
        #[arg(long, value_parser = crate::review::values::parse_rate)]
        limit: Option<(u32, crate::rules::Unit)>,
        /// Merge a domain defined in several files (as `serve --merge-domain-config`).
        #[arg(long, env = "PORTCULLIS_MERGE_DOMAIN_CONFIG")]
        merge_domain_config: bool,
        /// Show the limit as this scaling file scales it (as `serve --scaling-file`; temporary
        /// factors live in the store: `GET /scaling` or `/rlconfig` of a running replica).
        #[arg(long, env = "PORTCULLIS_SCALING_FILE")]
        scaling_file: Option<PathBuf>,
        #[command(flatten)]
        decisions: Decisions,
    },
    /// Run rules test files against a rules directory; exit 1 when a case fails, 2 when a test
    /// file or the rules cannot be used.
    Test {
        /// The rules directory, as `serve --config` takes it; without it, the first path given
        /// is the rules directory and the others are tests (`test RULES TESTS...`).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Test files, or directories of them (.yaml, .yml), after the rules directory when
        /// `--config` is not given.
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        /// Also write the results as JUnit XML to this file.
        #[arg(long)]
        junit: Option<PathBuf>,
        /// Merge a domain defined in several files (as `serve --merge-domain-config`).
        #[arg(long, env = "PORTCULLIS_MERGE_DOMAIN_CONFIG")]
        merge_domain_config: bool,
        #[command(flatten)]
        decisions: Decisions,
    },
    /// Say what changes between two rules directories, rule by rule (and case by case with
    /// --tests); exit 0 when nothing changes, 1 when something does, 2 on invalid input.
    Diff {
        /// The rules before the change.
        old: PathBuf,
        /// The rules after the change.
        new: PathBuf,
        /// Test files or directories whose descriptors and outcomes to compare too.
        #[arg(long, num_args = 1..)]
        tests: Vec<PathBuf>,
        /// JSON for tools instead of text.
        #[arg(long)]
        json: bool,
        /// Merge a domain defined in several files (as `serve --merge-domain-config`).
        #[arg(long, env = "PORTCULLIS_MERGE_DOMAIN_CONFIG")]
        merge_domain_config: bool,
        #[command(flatten)]
        decisions: Decisions,
    },
    /// Send one ShouldRateLimit request to a running server and print the answer; exit 0 when
    /// it is OK, 1 when it is OVER_LIMIT, 2 when no answer came.
    Ask {
        /// The server's gRPC address, `host:port` (or a URL: `http://host:port`).
        #[arg(long, env = "PORTCULLIS_ASK_ADDR", default_value = "127.0.0.1:8081")]
        addr: String,
        /// The request's domain.
        #[arg(long)]
        domain: String,
        /// Request-level hits_addend (0 counts as 1).
        #[arg(long, default_value_t = 0, conflicts_with = "probe")]
        hits: u32,
        /// Ask without spending: each descriptor is sent with hits_addend 0, a check-only call
        /// (the answer says whether a request would pass and what remains; nothing is counted,
        /// no concurrency slot taken). Without it, a concurrency slot the ask took is given back
        /// as soon as it is answered.
        #[arg(long)]
        probe: bool,
        /// A descriptor as key=value[,key=value...]; repeat for several descriptors.
        #[arg(short = 'd', long = "descriptor", required = true, value_parser = parse_descriptor)]
        descriptors: Vec<Vec<(String, String)>>,
    },
}

/// One descriptor on the command line: `k=v[,k2=v2...]`.
fn parse_descriptor(text: &str) -> Result<Vec<(String, String)>, String> {
    text.split(',').map(parse_entry).collect()
}

fn parse_entry(text: &str) -> Result<(String, String), String> {
    text.split_once('=')
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .ok_or_else(|| format!("{text:?} is not key=value"))
}

/// The command line and environment parsed, as `Cli::parse` would, with two differences: `serve`'s
/// settings know which flags the user set and by which variable (`Settings::sources`), and a
/// value refused from an environment variable names the variable, not only its flag. Exits with
/// clap's message (and code) on bad input.
pub fn parse_command_line() -> Cli {
    let command = Cli::command();
    let matches = match command.clone().try_get_matches() {
        Ok(matches) => matches,
        Err(e) => name_the_variable(e, &command).exit(),
    };
    refuse_unknown_variables(&command);
    let mut cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    if let (Command::Serve(settings), Some(("serve", serve))) =
        (&mut cli.command, matches.subcommand())
        && let Some(serve_command) = command.find_subcommand("serve")
    {
        settings.sources = Sources::from_matches(serve_command, serve);
    }
    cli
}

/// Exits (status 2, as a bad flag does) when the environment holds `PORTCULLIS_*` variables no
/// flag reads, naming each and the one it was likely meant to be.
pub fn refuse_unknown_variables(command: &clap::Command) {
    let unknown = super::variables::unknown(command, std::env::vars_os());
    if !unknown.is_empty() {
        eprintln!("error: {}", unknown.join("\nerror: "));
        std::process::exit(2);
    }
}

/// A bad value that came from a variable (its flag not on the command line): the message starts
/// with the variable, which is what the user set.
fn name_the_variable(error: clap::Error, command: &clap::Command) -> clap::Error {
    if !matches!(
        error.kind(),
        ErrorKind::InvalidValue | ErrorKind::ValueValidation
    ) {
        return error;
    }
    let Some(ContextValue::String(invalid)) = error.get(ContextKind::InvalidArg) else {
        return error;
    };
    let flag = invalid.split_whitespace().next().unwrap_or_default();
    let Some(long) = flag.strip_prefix("--") else {
        return error;
    };
    let on_command_line = std::env::args().any(|a| a == flag || a.starts_with(&format!("{flag}=")));
    let variable = command
        .get_subcommands()
        .flat_map(|sub| sub.get_arguments())
        .find(|arg| arg.get_long() == Some(long))
        .and_then(|arg| arg.get_env())
        .map(|var| var.to_string_lossy().into_owned())
        .filter(|var| std::env::var_os(var).is_some());
    match variable {
        Some(var) if !on_command_line => {
            let rendered = error.render().to_string();
            let detail = rendered.trim().trim_start_matches("error: ");
            let detail = detail.lines().next().unwrap_or(detail);
            clap::Error::raw(
                error.kind(),
                format!("{var} (the variable of {flag}) is not valid: {detail}\n"),
            )
            .with_cmd(command)
        }
        _ => error,
    }
}
