//! Which settings the user set, and where: a message about a setting names what the user wrote,
//! the variable (`PORTCULLIS_STORE_TIMEOUT`) when the environment set it, the flag
//! (`--store-timeout`) otherwise. Filled from clap's matches when the command line is parsed; it
//! must never change a value.

use std::collections::BTreeMap;

use clap::parser::ValueSource;
use clap::{ArgMatches, Command};

/// The flags set by the user (not left at their defaults), each with the variable that set it
/// when the environment did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Sources {
    /// `--flag` -> the variable that set it, or `None` when the command line did.
    set: BTreeMap<String, Option<String>>,
}

impl Sources {
    /// The flags of `command` that `matches` holds from the command line or the environment.
    pub fn from_matches(command: &Command, matches: &ArgMatches) -> Sources {
        let mut set = BTreeMap::new();
        for arg in command.get_arguments() {
            let (Some(long), id) = (arg.get_long(), arg.get_id().as_str()) else {
                continue;
            };
            let from = match matches.value_source(id) {
                Some(ValueSource::CommandLine) => None,
                Some(ValueSource::EnvVariable) => {
                    arg.get_env().map(|var| var.to_string_lossy().into_owned())
                }
                _ => continue,
            };
            set.insert(format!("--{long}"), from);
        }
        Sources { set }
    }

    /// Whether the user set `flag` (`--store`), by the command line or the environment.
    pub fn is_set(&self, flag: &str) -> bool {
        self.set.contains_key(flag)
    }

    /// What the user wrote for `flag`: its variable when the environment set it, else the flag.
    pub fn name(&self, flag: &str) -> String {
        match self.set.get(flag) {
            Some(Some(var)) => var.clone(),
            _ => flag.to_owned(),
        }
    }

    /// `text` with every flag the environment set written as its variable (`--store-timeout`
    /// becomes `PORTCULLIS_STORE_TIMEOUT`): a message names what the user wrote.
    pub fn spell(&self, text: &str) -> String {
        static FLAG: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
            regex::Regex::new("--[a-z0-9][a-z0-9-]*").expect("a regex")
        });
        FLAG.replace_all(text, |found: &regex::Captures<'_>| self.name(&found[0]))
            .into_owned()
    }

    /// The flags set whose names start with `prefix` (`--redis-`).
    pub fn set_with_prefix(&self, prefix: &str) -> Vec<String> {
        self.set
            .keys()
            .filter(|flag| flag.starts_with(prefix))
            .cloned()
            .collect()
    }
}
