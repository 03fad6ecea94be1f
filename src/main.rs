//! The `portcullis` binary: parse the command line, hand over to the library.

use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;

use portcullis::algorithm::Algorithm;
use portcullis::clock::SystemClock;
use portcullis::rules::scaling::Scaling;
use portcullis::rules::{self, LoadOptions, Lookup, MatchKind};
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
        return match go_settings(default_settings()) {
            Ok(settings) => serve(settings),
            Err(e) => {
                eprintln!("ratelimit: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let cli = Cli::parse();
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
            merge_domain_config,
        } => check(&dir, options(merge_domain_config)),
        Command::Explain {
            config,
            domain,
            entries,
            merge_domain_config,
            scaling_file,
        } => explain(
            &config,
            &domain,
            &entries,
            options(merge_domain_config),
            scaling_file.as_deref(),
        ),
        Command::Ask {
            addr,
            domain,
            hits,
            descriptors,
        } => ask(addr, domain, hits, descriptors),
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
        let running = match server::start(&settings, Arc::new(SystemClock::default())).await {
            Ok(running) => running,
            Err(e) => {
                eprintln!("portcullis: {e}");
                return ExitCode::FAILURE;
            }
        };
        shutdown_signal().await;
        running.drain(settings.drain_period).await;
        tracing::info!("stopped");
        // The batch exporter blocks while flushing: off the async worker.
        let _ = tokio::task::spawn_blocking(move || telemetry.shutdown()).await;
        ExitCode::SUCCESS
    })
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(term) => term,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

fn options(merge_domains: bool) -> LoadOptions {
    LoadOptions {
        merge_domains,
        default_algorithm: Algorithm::SlidingWindow,
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

fn check(dir: &std::path::Path, options: LoadOptions) -> ExitCode {
    match rules::load_dir(dir, options) {
        Ok(snapshot) => {
            for warning in snapshot.warnings() {
                eprintln!("warning: {warning}");
            }
            let count = snapshot.rules().len();
            println!(
                "{}: {} file(s), {} domain(s), {count} rule(s): OK",
                dir.display(),
                snapshot.files.len(),
                snapshot.domain_names().len()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}

fn explain(
    config: &std::path::Path,
    domain: &str,
    entries: &[(String, String)],
    options: LoadOptions,
    scaling_file: Option<&std::path::Path>,
) -> ExitCode {
    let scaling = match scaling_file {
        None => Scaling::default(),
        Some(path) => {
            let read = std::fs::read_to_string(path)
                .map_err(|e| format!("{}: {e}", path.display()))
                .and_then(|text| rules::scaling::parse_file(path, &text));
            match read {
                Ok(file) => Scaling {
                    file,
                    ..Scaling::default()
                },
                Err(e) => {
                    eprintln!("{e}");
                    return ExitCode::FAILURE;
                }
            }
        }
    };
    let snapshot = match rules::load_dir(config, options) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let (lookup, steps) = snapshot.explain(domain, entries);
    if matches!(lookup, Lookup::UnknownDomain) {
        println!(
            "domain {domain:?} is not configured (known: {:?}): every descriptor is OK, not counted",
            snapshot.domain_names()
        );
        return ExitCode::SUCCESS;
    }
    for (depth, step) in steps.iter().enumerate() {
        let how = match &step.matched {
            None => "no match at this level: the lookup stops here".to_owned(),
            Some((MatchKind::Exact, src)) => format!("exact value, at {src}"),
            Some((MatchKind::Wildcard(p), src)) => format!("wildcard {p:?}, at {src}"),
            Some((MatchKind::Default, src)) => format!("default (no value), at {src}"),
        };
        println!("level {}: {}={:?}: {how}", depth + 1, step.key, step.value);
    }
    match lookup {
        Lookup::Rule(resolved) => {
            println!("rule: {}", resolved.rule.describe());
            for (index, pattern) in &resolved.shared {
                println!(
                    "level {}: share_threshold: every value matching {pattern:?} counts in one counter",
                    index + 1
                );
            }
            if let Some(name) = &resolved.metric_name {
                println!("metrics: counted as {name:?}");
            }
            explain_scaling(&scaling, domain, resolved.rule);
        }
        _ if steps.len() < entries.len() => {
            println!("no rule: the descriptor is deeper than any rule that matched")
        }
        _ => {
            println!("no rule: nothing configured at this depth; the descriptor is OK, not counted")
        }
    }
    ExitCode::SUCCESS
}

/// What the scaling file makes of the rule's limits.
fn explain_scaling(scaling: &Scaling, domain: &str, rule: &rules::Rule) {
    let Some(limit) = rule.limit.filter(|_| rule.layers.is_empty()) else {
        for layer in &rule.layers {
            let factor = scaling.factor(domain, layer.name.as_deref());
            if factor != 1.0 {
                let scaled = rules::scaling::scale(&layer.limit, factor);
                println!(
                    "scaling: layer {} ×{factor}: {} per {}",
                    layer.name.as_deref().unwrap_or("(unnamed)"),
                    scaled.requests,
                    layer.unit
                );
            }
        }
        return;
    };
    let factor = scaling.factor(domain, rule.name.as_deref());
    if factor != 1.0 {
        let scaled = rules::scaling::scale(&limit, factor);
        let unit = rule.unit.map_or(String::new(), |u| format!(" per {u}"));
        println!("scaling: ×{factor}: {}{unit}", scaled.requests);
    }
}

fn ask(
    addr: String,
    domain: String,
    hits: u32,
    descriptors: Vec<Vec<(String, String)>>,
) -> ExitCode {
    use portcullis::pb::{
        RateLimitDescriptor, RateLimitRequest, RateLimitServiceClient,
        rate_limit_descriptor::Entry,
        rate_limit_response::{Code, rate_limit::Unit},
    };
    let request = RateLimitRequest {
        domain,
        hits_addend: hits,
        descriptors: descriptors
            .iter()
            .map(|entries| RateLimitDescriptor {
                entries: entries
                    .iter()
                    .map(|(key, value)| Entry {
                        key: key.clone(),
                        value: value.clone(),
                    })
                    .collect(),
                ..Default::default()
            })
            .collect(),
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("portcullis: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let answer = runtime.block_on(async {
        let mut client = RateLimitServiceClient::connect(addr.clone())
            .await
            .map_err(|e| format!("cannot connect to {addr}: {e}"))?;
        client
            .should_rate_limit(request)
            .await
            .map(|r| r.into_inner())
            .map_err(|s| format!("{:?}: {}", s.code(), s.message()))
    });
    let response = match answer {
        Ok(r) => r,
        Err(e) => {
            eprintln!("portcullis: {e}");
            return ExitCode::FAILURE;
        }
    };
    let code_name = |code: i32| Code::try_from(code).map_or("UNKNOWN", |c| c.as_str_name());
    println!("overall: {}", code_name(response.overall_code));
    for (entries, status) in descriptors.iter().zip(&response.statuses) {
        let shown: Vec<String> = entries.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let mut line = format!("  {}: {}", shown.join(","), code_name(status.code));
        if let Some(limit) = &status.current_limit {
            let unit = Unit::try_from(limit.unit).map_or("?", |u| u.as_str_name());
            line.push_str(&format!(
                ", limit {}/{}, remaining {}, reset in {}s",
                limit.requests_per_unit,
                unit.to_lowercase(),
                status.limit_remaining,
                status.duration_until_reset.map_or(0, |d| d.seconds)
            ));
            if !limit.name.is_empty() {
                line.push_str(&format!(" ({})", limit.name));
            }
        }
        println!("{line}");
    }
    for header in &response.response_headers_to_add {
        println!("  header {}: {}", header.key, header.value);
    }
    ExitCode::SUCCESS
}
