//! How the rules under review are decided: as the deployment decides them. The settings that
//! change a decision (the default algorithm of rules that name none, the override algorithm, how a
//! call is charged, shadow and quota modes, the Go drop-in mode's counting) come from the same
//! flags and variables `serve` reads, and every command says which it decided with. It must
//! never read the settings or the environment itself (`main` hands them over).

use crate::algorithm::ChargeMode;
use crate::rules::LoadOptions;
use crate::service::ServiceConfig;

/// The decision-changing settings of a deployment: how rule files load, and what the service
/// is told at start.
#[derive(Debug, Clone, Default)]
pub struct Mode {
    pub options: LoadOptions,
    pub service: ServiceConfig,
}

impl From<LoadOptions> for Mode {
    /// The command line's defaults for everything but how rules load.
    fn from(options: LoadOptions) -> Self {
        Mode {
            options,
            service: ServiceConfig::default(),
        }
    }
}

impl Mode {
    /// One line naming every setting that changes a decision, as the flags spell them.
    pub fn describe(&self) -> String {
        let on = |b: bool| if b { "on" } else { "off" };
        let algorithm = |a: crate::algorithm::Algorithm| a.name().replace('_', "-");
        format!(
            "deciding as a deployment with --default-algorithm {}, --override-algorithm {}, \
             --stop-charging-when-over {}, --shadow-mode {}, --quota-mode {}, Go counting (every \
             hit recorded) {}",
            algorithm(self.options.default_algorithm),
            algorithm(self.service.override_algorithm),
            on(self.service.charge == ChargeMode::AllOrNothing),
            on(self.service.global_shadow_mode),
            on(self.service.global_quota_mode),
            on(self.service.post_paid_everywhere),
        )
    }
}
