//! The `portcullis` binary: parse the command line, hand over to the library.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{CommandFactory, Parser};

mod ask;

use portcullis::algorithm::Algorithm;
use portcullis::clock::SystemClock;
use portcullis::review::explain::Call;
use portcullis::review::{self, commands};
use portcullis::rules::LoadOptions;
use portcullis::settings::{self, Cli, Command, Settings};
use portcullis::{server, telemetry};

// Calls allocate on one worker thread and free on another (a call's keys go to the Redis
// dispatcher, its replies come back); glibc's malloc then contends on its arena locks.
// mimalloc's per-thread heaps do not (BENCHMARKS.md: "allocator").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    // The image's `/bin/ratelimit`: a Deployment written for envoyproxy/ratelimit runs it with no
    // arguments and configures it through the Go service's environment variables.
    if invoked_as_ratelimit() {
        // Kubernetes appends a container's `args` to the image's entrypoint: the Go binary
        // takes none, so neither does this one.
        let args: Vec<String> = std::env::args().skip(1).collect();
        if !args.is_empty() {
            eprintln!(
                "ratelimit: arguments ignored (configured by environment variables): {args:?}"
            );
        }
        settings::refuse_unknown_variables(&Cli::command());
        return match go_settings(default_settings()) {
            Ok(settings) => serve(settings),
            Err(e) => {
                eprintln!("ratelimit: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let cli = settings::parse_command_line();
    match cli.command {
        Command::Serve(settings) if settings.env_compat.is_some() => match go_settings(*settings) {
            Ok(settings) => serve(settings),
            Err(e) => {
                eprintln!("portcullis: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Serve(settings) => serve(*settings),
        Command::Check {
            dir,
            config,
            merge_domain_config,
            allow_empty_rules,
        } => exit(commands::check(
            // clap requires exactly one of the two.
            &dir.or(config).unwrap_or_default(),
            options(merge_domain_config),
            allow_empty_rules,
            &mut std::io::stdout(),
            &mut std::io::stderr(),
        )),
        Command::Explain {
            config,
            domain,
            entries,
            limit,
            merge_domain_config,
            scaling_file,
            decisions,
        } => {
            let Some(mode) = review_mode(&decisions, merge_domain_config) else {
                return ExitCode::from(commands::UNUSABLE);
            };
            let call = Call {
                domain,
                descriptor: entries,
                limit,
                ..Call::default()
            };
            exit(commands::explain(
                &config,
                &call,
                &mode,
                scaling_file.as_deref(),
                &mut std::io::stdout(),
                &mut std::io::stderr(),
            ))
        }
        Command::Test {
            config,
            paths,
            junit,
            merge_domain_config,
            decisions,
        } => {
            let Some(mode) = review_mode(&decisions, merge_domain_config) else {
                return ExitCode::from(commands::UNUSABLE);
            };
            let (rules, tests) = match config {
                Some(rules) => (rules, paths),
                None => {
                    let mut paths = paths.into_iter();
                    let rules = paths.next().unwrap_or_default();
                    let tests: Vec<_> = paths.collect();
                    if tests.is_empty() {
                        eprintln!(
                            "portcullis test: give the rules directory and test files \
                             (test RULES TESTS... or test --config RULES TESTS...)"
                        );
                        return ExitCode::from(2);
                    }
                    (rules, tests)
                }
            };
            exit(commands::test(
                &rules,
                &tests,
                &mode,
                junit.as_deref(),
                &mut std::io::stdout(),
                &mut std::io::stderr(),
            ))
        }
        Command::Diff {
            old,
            new,
            tests,
            json,
            merge_domain_config,
            decisions,
        } => {
            let Some(mode) = review_mode(&decisions, merge_domain_config) else {
                return ExitCode::from(commands::UNUSABLE);
            };
            exit(commands::diff(
                &old,
                &new,
                &tests,
                &mode,
                json,
                &mut std::io::stdout(),
                &mut std::io::stderr(),
            ))
        }
        Command::Ask {
            addr,
            domain,
            hits,
            probe,
            descriptors,
        } => ask::ask(addr, domain, hits, probe, descriptors),
    }
}

fn serve(settings: Settings) -> ExitCode {
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("portcullis: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async {
        let telemetry = telemetry::init(
            &settings.log_level,
            settings.log_format,
            &settings.tracing(),
        );
        let mut signals = Signals::listen();
        let started = tokio::select! {
            started = server::start(&settings, Arc::new(SystemClock::default())) => started,
            // Not serving yet: nothing to drain.
            () = signals.next() => {
                eprintln!("portcullis: stopped by a signal before it served");
                return ExitCode::SUCCESS;
            }
        };
        let mut running = match started {
            Ok(running) => running,
            Err(e) => {
                eprintln!("portcullis: {e}");
                return ExitCode::FAILURE;
            }
        };
        let (code, drain_period) = tokio::select! {
            () = signals.next() => (ExitCode::SUCCESS, settings.drain_period),
            // Never ready (the store never answered): nobody routes here, nothing to drain.
            reason = running.fatal() => {
                eprintln!("portcullis: {reason}");
                (ExitCode::FAILURE, Duration::ZERO)
            }
        };
        // A second signal during the drain stops at once (an operator's second Ctrl-C, or a
        // kubelet that will not wait): in-flight calls are cut, as a kill would.
        tokio::select! {
            () = running.drain(drain_period) => {}
            () = signals.next() => {
                eprintln!("portcullis: a second signal during the drain: stopping now");
                // Not through the runtime's drop, which would wait for its blocking tasks.
                std::process::exit(130);
            }
        }
        tracing::info!("stopped");
        // The batch exporter blocks while flushing: off the async worker.
        let _ = tokio::task::spawn_blocking(move || telemetry.shutdown()).await;
        code
    })
}

/// SIGTERM and SIGINT, listened for from before the start: one that comes while the listeners
/// open (or while the first xDS rules are awaited) is answered by a prompt exit, not by the
/// signal's default action halfway through a start.
struct Signals {
    term: Option<tokio::signal::unix::Signal>,
    int: Option<tokio::signal::unix::Signal>,
}

impl Signals {
    fn listen() -> Signals {
        use tokio::signal::unix::{SignalKind, signal};
        Signals {
            term: signal(SignalKind::terminate()).ok(),
            int: signal(SignalKind::interrupt()).ok(),
        }
    }

    /// The next SIGTERM or SIGINT.
    async fn next(&mut self) {
        async fn recv(signal: &mut Option<tokio::signal::unix::Signal>) {
            match signal {
                Some(signal) => {
                    signal.recv().await;
                }
                None => std::future::pending().await,
            }
        }
        let Signals { term, int } = self;
        tokio::select! {
            () = recv(term) => {}
            () = recv(int) => {}
        }
    }
}

fn options(merge_domains: bool) -> LoadOptions {
    LoadOptions {
        merge_domains,
        default_algorithm: Algorithm::SlidingWindow,
    }
}

/// How a rules command decides: as a deployment with this environment and these flags.
fn review_mode(decisions: &settings::Decisions, merge_domains: bool) -> Option<review::Mode> {
    match decisions.mode(merge_domains, &settings::go::process_env) {
        Ok(mode) => Some(mode),
        Err(e) => {
            eprintln!("portcullis: {e}");
            None
        }
    }
}

fn invoked_as_ratelimit() -> bool {
    std::env::args_os()
        .next()
        .map(std::path::PathBuf::from)
        .and_then(|p| p.file_name().map(|n| n == "ratelimit"))
        .unwrap_or(false)
}

/// `serve`'s settings with nothing given: Portcullis' own defaults (and PORTCULLIS_* variables)
/// under the Go environment.
fn default_settings() -> Settings {
    match Cli::try_parse_from(["portcullis", "serve"]) {
        Ok(Cli {
            command: Command::Serve(settings),
        }) => *settings,
        Ok(_) => unreachable!("`serve` parses as Command::Serve"),
        Err(e) => e.exit(),
    }
}

fn go_settings(base: Settings) -> Result<Settings, settings::SettingsError> {
    settings::go::from_go_env(base, &settings::go::process_env)
}

/// A rules command's exit code, its output already written.
fn exit(code: u8) -> ExitCode {
    ExitCode::from(code)
}
