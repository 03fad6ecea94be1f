//! The command line: the subcommands and their own arguments (`serve` takes every `Settings`
//! flag). It must never read a setting's value itself: clap parses, `Settings` holds.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use super::Settings;

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
        /// The rules directory.
        dir: PathBuf,
        /// Merge a domain defined in several files (as `serve --merge-domain-config`).
        #[arg(long, env = "PORTCULLIS_MERGE_DOMAIN_CONFIG")]
        merge_domain_config: bool,
    },
    /// Show which rule a descriptor matches, level by level, and why.
    Explain {
        #[arg(long, env = "PORTCULLIS_CONFIG")]
        config: PathBuf,
        #[arg(long)]
        domain: String,
        /// The descriptor's entries in order, as key=value (key= for an empty value).
        #[arg(required = true, value_parser = parse_entry)]
        entries: Vec<(String, String)>,
        /// Merge a domain defined in several files (as `serve --merge-domain-config`).
        #[arg(long, env = "PORTCULLIS_MERGE_DOMAIN_CONFIG")]
        merge_domain_config: bool,
        /// Show the limit as this scaling file scales it (as `serve --scaling-file`; temporary
        /// factors live in the store: `GET /scaling` or `/rlconfig` of a running replica).
        #[arg(long, env = "PORTCULLIS_SCALING_FILE")]
        scaling_file: Option<PathBuf>,
    },
    /// Run rules test files against a rules directory; exit 1 when a case fails, 2 when a test
    /// file or the rules cannot be used.
    Test {
        /// The rules directory (as `serve --config` takes it).
        rules: PathBuf,
        /// Test files, or directories of them (.yaml, .yml).
        #[arg(required = true)]
        tests: Vec<PathBuf>,
        /// Also write the results as JUnit XML to this file.
        #[arg(long)]
        junit: Option<PathBuf>,
        /// Merge a domain defined in several files (as `serve --merge-domain-config`).
        #[arg(long, env = "PORTCULLIS_MERGE_DOMAIN_CONFIG")]
        merge_domain_config: bool,
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
    },
    /// Send one ShouldRateLimit request to a running server and print the answer.
    Ask {
        /// The server's gRPC address.
        #[arg(
            long,
            env = "PORTCULLIS_ASK_ADDR",
            default_value = "http://127.0.0.1:8081"
        )]
        addr: String,
        #[arg(long)]
        domain: String,
        /// Request-level hits_addend (0 counts as 1).
        #[arg(long, default_value_t = 0)]
        hits: u32,
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
