//! A rules test file as written: every key a test file may hold, each with its line where an
//! error must point at it. Unknown and duplicate keys are refused by the parser; what a value
//! means is checked in `spec.rs`. Plain data: it must never decide anything.

use serde::Deserialize;
use serde_saphyr::Spanned;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileYaml {
    pub(super) domain: Option<String>,
    pub(super) scaling: Option<Spanned<String>>,
    pub(super) cases: Option<Vec<Spanned<CaseYaml>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct CaseYaml {
    pub(super) name: Option<String>,
    pub(super) domain: Option<String>,
    pub(super) descriptor: Option<Vec<String>>,
    pub(super) limit: Option<String>,
    pub(super) also: Option<Vec<Vec<String>>>,
    pub(super) expect: Option<Spanned<ExpectYaml>>,
    pub(super) steps: Option<Vec<Spanned<StepYaml>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ExpectYaml {
    pub(super) rule: Option<String>,
    pub(super) no_rule: Option<bool>,
    pub(super) limit: Option<String>,
    pub(super) algorithm: Option<String>,
    pub(super) burst: Option<u64>,
    pub(super) layers: Option<Vec<Spanned<LayerYaml>>>,
    pub(super) shadow: Option<bool>,
    pub(super) quota: Option<bool>,
    pub(super) post_paid: Option<bool>,
    pub(super) unlimited: Option<bool>,
    pub(super) replaced: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct LayerYaml {
    pub(super) name: Option<String>,
    pub(super) limit: Option<String>,
    pub(super) algorithm: Option<String>,
    pub(super) burst: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct StepYaml {
    pub(super) at: Option<String>,
    pub(super) after: Option<String>,
    pub(super) hits: Option<u32>,
    pub(super) refund: Option<u32>,
    pub(super) repeat: Option<u32>,
    pub(super) expect: Option<String>,
    pub(super) allowed: Option<u32>,
    pub(super) remaining: Option<u32>,
    pub(super) reset: Option<String>,
    pub(super) limit: Option<String>,
    pub(super) binding: Option<String>,
}
