//! Rules hot reload: the rules directory watched (`watch`), a changed set validated as a whole and
//! swapped in atomically. Calls in flight keep the snapshot they started with. A set that fails
//! validation is refused, its errors logged with file and line and counted; the last good rules
//! stay in force. A valid set that would remove a domain in service, or leave none, is refused
//! too (logged at warn, counted as `refused`) unless `allow_removal`: an emptied ConfigMap must not
//! silently switch a domain's limits off. It must never leave a half-loaded set in force.

use std::path::PathBuf;
use std::sync::Arc;

use arc_swap::ArcSwap;

use super::watch::{Refusal, Watched};
use crate::rules::{self, LoadOptions, RuleFiles, Snapshot};
use crate::telemetry::{Metrics, ResultLabels};

pub struct RulesWatch {
    pub dir: PathBuf,
    pub rules: Arc<ArcSwap<Snapshot>>,
    pub metrics: Arc<Metrics>,
    /// Accept a set that removes domains in service (or leaves none).
    pub allow_removal: bool,
    pub options: LoadOptions,
}

impl RulesWatch {
    fn count(&self, result: &str) {
        self.metrics
            .rules_reloads
            .get_or_create(&ResultLabels {
                result: result.into(),
            })
            .inc();
    }
}

impl Watched for RulesWatch {
    type Content = RuleFiles;

    fn what(&self) -> String {
        format!("rules in {}", self.dir.display())
    }

    fn read(&self) -> Result<(u64, RuleFiles), String> {
        let files = rules::read_dir(&self.dir).map_err(|e| e.to_string())?;
        Ok((files.fingerprint(), files))
    }

    fn apply(&self, files: RuleFiles) -> Result<String, Refusal> {
        let snapshot = match rules::parse(&files, self.options) {
            Ok(snapshot) => snapshot,
            Err(e) => {
                self.count("error");
                return Err(Refusal::Invalid(e.to_string()));
            }
        };
        if !self.allow_removal {
            let current = self.rules.load();
            let removed: Vec<&str> = current
                .domain_names()
                .into_iter()
                .filter(|d| !snapshot.has_domain(d))
                .collect();
            if !removed.is_empty() {
                self.count("refused");
                return Err(Refusal::Unsafe(format!(
                    "the new rules no longer define domain(s) {removed:?}, which would stop \
                     limiting them; restore them, or start with --allow-rules-removal if this is \
                     intended"
                )));
            }
        }
        let summary = format!(
            "{} file(s), {} domain(s), {} rule(s)",
            snapshot.files.len(),
            snapshot.domain_names().len(),
            snapshot.rules().len()
        );
        self.metrics.rules_loaded(snapshot.loaded_at);
        self.rules.store(Arc::new(snapshot));
        self.count("success");
        Ok(summary)
    }
}
