//! The `PORTCULLIS_*` variables of the environment that no flag reads. A misspelled one
//! (`PORTCULLIS_STOR=redis`) would otherwise start a replica on a default nobody chose: on
//! Kubernetes, every replica on its own memory store, N times the limit. Each is refused at
//! start, naming the nearest real variable. It must never refuse what Kubernetes itself puts in
//! a pod's environment: the service links of a Service whose name starts with `portcullis`
//! (`PORTCULLIS_SERVICE_HOST`, `PORTCULLIS_PORT_8081_TCP_ADDR`, `PORTCULLIS_METRICS_PORT`, …).

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::sync::LazyLock;

use regex::Regex;

const PREFIX: &str = "PORTCULLIS_";

/// Every variable a flag of `command` (or of any of its subcommands) reads.
fn known(command: &clap::Command) -> BTreeSet<String> {
    let mut names: BTreeSet<String> = command
        .get_arguments()
        .filter_map(|arg| arg.get_env())
        .map(|var| var.to_string_lossy().into_owned())
        .collect();
    for sub in command.get_subcommands() {
        names.extend(known(sub));
    }
    names
}

/// A variable Kubernetes sets for a Service (`enableServiceLinks`, on by default): the
/// Service's name upper-cased with `-` as `_`, then `_SERVICE_HOST`, `_SERVICE_PORT[_NAME]`,
/// `_PORT` (`tcp://10.0.0.11:8081`) or `_PORT_<port>_<protocol>[_PROTO|_PORT|_ADDR]`.
fn is_service_link(name: &str, value: &str) -> bool {
    static LINK: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(
            r"^[A-Z0-9_]+?_(SERVICE_HOST|SERVICE_PORT(_[A-Z0-9_]+)?|PORT_[0-9]+_(TCP|UDP|SCTP)(_PROTO|_PORT|_ADDR)?)$",
        )
        .expect("a valid pattern")
    });
    let docker_link = |v: &str| {
        ["tcp://", "udp://", "sctp://"]
            .iter()
            .any(|s| v.starts_with(s))
    };
    LINK.is_match(name) || (name.ends_with("_PORT") && docker_link(value))
}

/// The variables of `vars` under `PORTCULLIS_` that no flag of `command` reads, each with the
/// nearest one that does (by edit distance, when it is close enough to be a slip).
pub fn unknown(
    command: &clap::Command,
    vars: impl IntoIterator<Item = (OsString, OsString)>,
) -> Vec<String> {
    let known = known(command);
    let mut problems: Vec<String> = vars
        .into_iter()
        .filter_map(|(name, value)| {
            let name = name.into_string().ok()?;
            let value = value.to_string_lossy();
            (name.starts_with(PREFIX) && !known.contains(&name) && !is_service_link(&name, &value))
                .then_some(name)
        })
        .map(|name| {
            let nearest = known
                .iter()
                .map(|k| (strsim::damerau_levenshtein(&name, k), k))
                .min();
            match nearest {
                // Within a third of the name's own part (past the prefix): a slip, not another
                // word.
                Some((distance, k)) if distance <= (name.len() - PREFIX.len()).div_ceil(3) => {
                    format!("{name} is not a Portcullis variable: did you mean {k}?")
                }
                _ => format!(
                    "{name} is not a Portcullis variable (`portcullis serve --help` lists them, \
                     each flag with its variable)"
                ),
            }
        })
        .collect();
    problems.sort();
    problems
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn vars(pairs: &[(&str, &str)]) -> Vec<(OsString, OsString)> {
        pairs.iter().map(|(k, v)| (k.into(), v.into())).collect()
    }

    #[test]
    fn a_misspelled_variable_is_named_with_the_one_meant() {
        let command = super::super::Cli::command();
        let found = unknown(
            &command,
            vars(&[
                ("PORTCULLIS_STOR", "redis"),
                ("PORTCULLIS_REDIS_ULR", "redis://r:6379"),
                ("PORTCULLIS_STORE", "redis"),
                ("PORTCULLIS_ASK_ADDR", "127.0.0.1:8081"),
                ("PORTCULLIS_WHATEVER_ELSE_ENTIRELY", "1"),
                ("PATH", "/bin"),
            ]),
        );
        assert_eq!(
            found,
            [
                "PORTCULLIS_REDIS_ULR is not a Portcullis variable: did you mean PORTCULLIS_REDIS_URL?",
                "PORTCULLIS_STOR is not a Portcullis variable: did you mean PORTCULLIS_STORE?",
                "PORTCULLIS_WHATEVER_ELSE_ENTIRELY is not a Portcullis variable (`portcullis serve --help` lists them, each flag with its variable)",
            ]
        );
    }

    #[test]
    fn kubernetes_service_links_are_not_refused() {
        let command = super::super::Cli::command();
        // As Kubernetes sets them for Services named portcullis and portcullis-metrics.
        let links = vars(&[
            ("PORTCULLIS_SERVICE_HOST", "10.0.0.11"),
            ("PORTCULLIS_SERVICE_PORT", "8081"),
            ("PORTCULLIS_SERVICE_PORT_GRPC", "8081"),
            ("PORTCULLIS_PORT", "tcp://10.0.0.11:8081"),
            ("PORTCULLIS_PORT_8081_TCP", "tcp://10.0.0.11:8081"),
            ("PORTCULLIS_PORT_8081_TCP_PROTO", "tcp"),
            ("PORTCULLIS_PORT_8081_TCP_PORT", "8081"),
            ("PORTCULLIS_PORT_8081_TCP_ADDR", "10.0.0.11"),
            ("PORTCULLIS_METRICS_SERVICE_HOST", "10.0.0.12"),
            ("PORTCULLIS_METRICS_PORT", "tcp://10.0.0.12:9090"),
            ("PORTCULLIS_METRICS_PORT_9090_TCP_ADDR", "10.0.0.12"),
        ]);
        assert_eq!(unknown(&command, links), Vec::<String>::new());
        // The shape alone is not enough where a typo could take it: a `_PORT` that is no link.
        assert_eq!(
            unknown(&command, vars(&[("PORTCULLIS_GRCP_PORT", "8081")])).len(),
            1
        );
    }

    #[test]
    fn every_flag_variable_is_known() {
        let command = super::super::Cli::command();
        let all: Vec<(OsString, OsString)> = known(&command)
            .into_iter()
            .map(|k| (k.into(), "x".into()))
            .collect();
        assert!(all.len() > 60, "{} variables", all.len());
        assert_eq!(unknown(&command, all), Vec::<String>::new());
    }
}
