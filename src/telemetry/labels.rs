//! The label sets of the metrics: which rule, which gRPC code, which kind of failure, which domain,
//! failure mode, listener or result. Every value is bounded by configuration, never by a request,
//! except where a rule asks for per-value series (`detailed_metric`, capped).

use prometheus_client::encoding::EncodeLabelSet;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RuleLabels {
    pub domain: String,
    /// The rule as configured (`domain.key_value.key`); with the request's values when the rule
    /// says `detailed_metric` (capped by `--max-detailed-series`); the keys only for a limit the
    /// request carried. Cardinality stays what the rules file and the cap allow.
    pub rule: String,
}

/// A configured rule (or layer: `rule/name`) and the unit of its limit: one series per rule of the
/// rules files, never per request value.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RuleLimitLabels {
    pub domain: String,
    pub rule: String,
    pub unit: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CodeLabels {
    pub code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DomainLabels {
    pub domain: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModeLabels {
    pub mode: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ListenerLabels {
    pub listener: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub result: String,
}
