//! The settings that change a decision, as the rules commands (`test`, `diff`, `explain`) take
//! them: the same flags as `serve`, on top of the same `PORTCULLIS_*` variables (and, in the Go
//! drop-in mode, envoyproxy/ratelimit's), so that a rules test decides as the deployment does.
//! It must never take a setting that only `serve` acts on.

use clap::builder::{EnumValueParser, PossibleValuesParser, TypedValueParser};
use clap::{Args, Parser};

use super::values::AlgorithmArg;
use super::{Cli, Command, Settings, SettingsError, go};
use crate::algorithm::Algorithm;
use crate::review::Mode;

#[derive(Clone, Debug, Default, Args)]
pub struct Decisions {
    /// The algorithm of rules that name none, as `serve --default-algorithm` (default: the
    /// deployment's PORTCULLIS_DEFAULT_ALGORITHM, fixed window in the Go mode, else sliding
    /// window).
    #[arg(long, value_parser = EnumValueParser::<AlgorithmArg>::new().map(Algorithm::from))]
    pub default_algorithm: Option<Algorithm>,
    /// The algorithm of limits a request carries, as `serve --override-algorithm`.
    #[arg(long, value_parser = EnumValueParser::<AlgorithmArg>::new().map(Algorithm::from))]
    pub override_algorithm: Option<Algorithm>,
    /// A call refused by any descriptor charges none, as `serve --stop-charging-when-over`.
    #[arg(long)]
    pub stop_charging_when_over: bool,
    /// Never answer OVER_LIMIT overall, as `serve --shadow-mode`.
    #[arg(long)]
    pub shadow_mode: bool,
    /// Every limit is a quota, as `serve --quota-mode`.
    #[arg(long)]
    pub quota_mode: bool,
    /// Decide as the Go drop-in mode does (`go`: envoyproxy/ratelimit's variables read, every hit
    /// counted, fixed windows by default), as `serve --env-compat go` or the `ratelimit` binary.
    #[arg(long, value_parser = PossibleValuesParser::new(["go"]))]
    pub env_compat: Option<String>,
}

impl Decisions {
    /// The mode a deployment with this environment and these flags decides in: `serve`'s
    /// settings read from the environment (`PORTCULLIS_*`; in the Go mode the Go service's
    /// variables too), the flags given here on top.
    pub fn mode(
        &self,
        merge_domain_config: bool,
        var: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Mode, SettingsError> {
        let mut settings = match Cli::try_parse_from(["portcullis", "serve"]) {
            Ok(Cli {
                command: Command::Serve(settings),
            }) => *settings,
            Ok(_) => unreachable!("`serve` parses as Command::Serve"),
            Err(e) => return Err(SettingsError(vec![e.to_string()])),
        };
        if self.env_compat.is_some() {
            settings.env_compat = self.env_compat.clone();
        }
        if settings.env_compat.is_some() {
            settings = go::from_go_env(settings, var)?;
        }
        self.apply(&mut settings);
        settings.merge_domain_config |= merge_domain_config;
        Ok(Mode {
            options: settings.load_options(),
            service: settings.service_config(),
        })
    }

    /// The flags given, over whatever the environment said.
    fn apply(&self, s: &mut Settings) {
        if let Some(algorithm) = self.default_algorithm {
            s.default_algorithm = algorithm;
        }
        if let Some(algorithm) = self.override_algorithm {
            s.override_algorithm = algorithm;
        }
        s.stop_charging_when_over |= self.stop_charging_when_over;
        s.shadow_mode |= self.shadow_mode;
        s.quota_mode |= self.quota_mode;
    }
}
