//! Rules hot reload: the rules directory watched (`watch`), a changed set validated as a whole and
//! swapped in atomically. Calls in flight keep the snapshot they started with. A set that fails
//! validation is refused, its errors logged with file and line and counted; the last good rules
//! stay in force. It must never leave a half-loaded set in force.

use std::path::PathBuf;
use std::sync::Arc;

use arc_swap::ArcSwap;

use super::watch::Watched;
use crate::rules::{self, RuleFiles, Snapshot};
use crate::telemetry::{Metrics, ResultLabels};

pub struct RulesWatch {
    pub dir: PathBuf,
    pub rules: Arc<ArcSwap<Snapshot>>,
    pub metrics: Arc<Metrics>,
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

    fn apply(&self, files: RuleFiles) -> Result<String, String> {
        match rules::parse(&files) {
            Ok(snapshot) => {
                let summary = format!(
                    "{} file(s), {} rule(s)",
                    snapshot.files.len(),
                    snapshot.rules().len()
                );
                self.metrics.rules_loaded(snapshot.loaded_at);
                self.rules.store(Arc::new(snapshot));
                self.count("success");
                Ok(summary)
            }
            Err(e) => {
                self.count("error");
                Err(e.to_string())
            }
        }
    }
}
