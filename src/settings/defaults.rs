//! Settings for an in-process server (tests, benchmarks): the command line's own defaults, parsed
//! as `serve --config DIR` would parse them with no environment, then the few changes a test
//! needs (ephemeral loopback ports, a generous store deadline, short reload and drain periods).
//! One place for defaults: it must never restate a default the command line already gives.

use std::path::PathBuf;
use std::time::Duration;

use clap::{CommandFactory, FromArgMatches};

use super::{Cli, Settings};

impl Settings {
    /// Settings for an in-process server on ephemeral loopback ports (tests, benchmarks).
    pub fn for_tests(config: PathBuf) -> Self {
        // The environment is not read: a test must not depend on the machine's PORTCULLIS_*.
        let command =
            Cli::command().mut_subcommand("serve", |serve| serve.mut_args(|arg| arg.env(None)));
        let matches = command
            .try_get_matches_from([
                "portcullis".into(),
                "serve".into(),
                "--config".into(),
                config.into_os_string(),
            ])
            .expect("the command line's defaults parse");
        let (_, serve) = matches.subcommand().expect("serve");
        let mut settings = Settings::from_arg_matches(serve).expect("serve's settings");
        settings.grpc_addr = ([127, 0, 0, 1], 0).into();
        settings.admin_addr = ([127, 0, 0, 1], 0).into();
        // Tests that run a store decide within seconds, not Envoy's milliseconds.
        settings.store_timeout = Duration::from_secs(2);
        settings.drain_period = Duration::from_millis(100);
        settings.reload_interval = Duration::from_millis(100);
        settings.log_level = "warn".into();
        settings
    }
}
