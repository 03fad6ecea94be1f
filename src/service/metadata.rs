//! The response's dynamic metadata, as the Go service writes it with `RESPONSE_DYNAMIC_METADATA`:
//! the domain, each descriptor (`entries` as `key=value` strings, its `limit` override and
//! `hitsAddend` when set), the request's `hitsAddend` when not 0, and `metadata`: the rules'
//! `metadata` of the descriptors that passed, merged (the first one wins a conflict; maps merge).
//! Apart from it, `held`: the slots each concurrency descriptor took (`concurrency`, written
//! whatever the flag says), which Envoy's release at stream end reads back, so that a request that
//! took nothing gives nothing back.
//! It must never put a value there that the request or the rules did not give.

use std::collections::BTreeMap;

use prost_types::{ListValue, Struct, Value, value::Kind};

use super::plan::Planned;
use crate::algorithm::{Algorithm, ChargeMode};
use crate::pb::rate_limit_response::{Code, DescriptorStatus};
use crate::pb::{RateLimitRequest, RateLimitUnit};

fn text(s: impl Into<String>) -> Value {
    Value {
        kind: Some(Kind::StringValue(s.into())),
    }
}

fn number(n: f64) -> Value {
    Value {
        kind: Some(Kind::NumberValue(n)),
    }
}

fn object(fields: BTreeMap<String, Value>) -> Value {
    Value {
        kind: Some(Kind::StructValue(Struct { fields })),
    }
}

fn list(values: Vec<Value>) -> Value {
    Value {
        kind: Some(Kind::ListValue(ListValue { values })),
    }
}

/// A YAML/JSON value of the rules as a protobuf value.
fn from_json(value: &serde_json::Value) -> Value {
    match value {
        serde_json::Value::Null => Value {
            kind: Some(Kind::NullValue(0)),
        },
        serde_json::Value::Bool(b) => Value {
            kind: Some(Kind::BoolValue(*b)),
        },
        serde_json::Value::Number(n) => number(n.as_f64().unwrap_or(0.0)),
        serde_json::Value::String(s) => text(s.clone()),
        serde_json::Value::Array(items) => list(items.iter().map(from_json).collect()),
        serde_json::Value::Object(map) => {
            object(map.iter().map(|(k, v)| (k.clone(), from_json(v))).collect())
        }
    }
}

/// Adds `from`'s fields to `into`: fields already there stay, except that two maps merge.
fn merge(into: &mut BTreeMap<String, Value>, from: BTreeMap<String, Value>) {
    for (key, value) in from {
        match (into.get_mut(&key), value) {
            (
                Some(Value {
                    kind: Some(Kind::StructValue(ours)),
                }),
                Value {
                    kind: Some(Kind::StructValue(theirs)),
                },
            ) => merge(&mut ours.fields, theirs.fields),
            (Some(_), _) => {}
            (None, value) => {
                into.insert(key, value);
            }
        }
    }
}

pub(super) fn describe(
    request: &RateLimitRequest,
    planned: &[Planned],
    statuses: &[DescriptorStatus],
) -> Struct {
    let mut fields = BTreeMap::new();
    fields.insert("domain".to_owned(), text(request.domain.clone()));
    let descriptors = request
        .descriptors
        .iter()
        .map(|d| {
            let mut fields = BTreeMap::new();
            let entries = d
                .entries
                .iter()
                .map(|e| text(format!("{}={}", e.key, e.value)))
                .collect();
            fields.insert("entries".to_owned(), list(entries));
            if let Some(limit) = &d.limit {
                let unit =
                    RateLimitUnit::try_from(limit.unit).map_or("UNKNOWN", |u| u.as_str_name());
                fields.insert(
                    "limit".to_owned(),
                    text(format!(
                        "requests_per_unit:{} unit:{unit}",
                        limit.requests_per_unit
                    )),
                );
            }
            if let Some(hits) = d.hits_addend {
                fields.insert("hitsAddend".to_owned(), number(hits as f64));
            }
            object(fields)
        })
        .collect();
    fields.insert("descriptors".to_owned(), list(descriptors));
    if request.hits_addend != 0 {
        fields.insert(
            "hitsAddend".to_owned(),
            number(f64::from(request.hits_addend)),
        );
    }
    let mut passed = BTreeMap::new();
    for (p, s) in planned.iter().zip(statuses) {
        let limited = p.rule.as_ref().filter(|r| !r.is_unlimited());
        if let Some(meta) = limited.and_then(|r| r.metadata.as_ref())
            && s.code != Code::OverLimit as i32
        {
            let from = meta
                .iter()
                .map(|(k, v)| (k.clone(), from_json(v)))
                .collect();
            merge(&mut passed, from);
        }
    }
    if !passed.is_empty() {
        fields.insert("metadata".to_owned(), object(passed));
    }
    Struct { fields }
}

/// The slots each concurrency charge of the call took, by its descriptor's keys joined with `.`
/// (`user`, `user.model`): its hits when it was charged, 0 when it was refused or not charged (a
/// probe, an all-or-nothing call refused). `None` when the call has no concurrency charge.
/// Numbers as text: Envoy's `%DYNAMIC_METADATA(...)%` prints a string as it is.
pub(super) fn held(
    request: &RateLimitRequest,
    planned: &[Planned],
    charge: ChargeMode,
    refused: bool,
) -> Option<(String, Value)> {
    let charged = match charge {
        ChargeMode::Probe => false,
        ChargeMode::AllOrNothing => !refused,
        ChargeMode::EachAlone => true,
    };
    let mut held = BTreeMap::new();
    for (d, p) in request.descriptors.iter().zip(planned) {
        let concurrency = p
            .check
            .iter()
            .chain(p.layers.iter().map(|l| &l.check))
            .any(|c| c.limit.algorithm == Algorithm::Concurrency);
        if !concurrency || p.refund {
            continue;
        }
        let took = match p.decision {
            Some(decision) if decision.allowed && charged && !decision.by_failure_mode => p.hits,
            _ => 0,
        };
        let keys: Vec<&str> = d.entries.iter().map(|e| e.key.as_str()).collect();
        held.insert(keys.join("."), text(took.to_string()));
    }
    (!held.is_empty()).then(|| ("held".to_owned(), object(held)))
}
