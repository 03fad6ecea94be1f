//! The command line's names and the secrets' Debug output.

use super::*;
use clap::Parser;

#[test]
fn secrets_never_reach_debug_output() {
    assert_eq!(format!("{:?}", Secret("hunter2".into())), "<redacted>");
}

#[test]
fn command_line_names_map_onto_the_domain() {
    let cli = Cli::try_parse_from([
        "portcullis",
        "serve",
        "--failure-mode",
        "local",
        "--response-headers",
        "draft03",
        "--log-format",
        "json",
    ])
    .expect("parses");
    let Command::Serve(settings) = cli.command else {
        panic!("serve expected");
    };
    assert_eq!(settings.failure_mode, FailureMode::Local);
    assert_eq!(settings.response_headers, HeadersMode::Draft03);
    assert_eq!(settings.log_format, LogFormat::Json);
    assert!(Cli::try_parse_from(["portcullis", "serve", "--failure-mode", "maybe"]).is_err());
}
