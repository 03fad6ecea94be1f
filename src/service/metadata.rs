//! The response's dynamic metadata, as the Go service writes it with `RESPONSE_DYNAMIC_METADATA`:
//! the domain, each descriptor (`entries` as `key=value` strings, its `limit` override and
//! `hitsAddend` when set), the request's `hitsAddend` when not 0, and `metadata`: the rules'
//! `metadata` of the descriptors that passed, merged (the first one wins a conflict; maps merge).
//! Apart from it, `held` and `lease`: the slots each concurrency descriptor took and the name of
//! their leases (written whatever the flag says), which Envoy's release at stream end reads back,
//! so that a request frees only what it took.
//! It must never put a value there that the request or the rules did not give.

use std::collections::BTreeMap;

use prost_types::{ListValue, Struct, Value, value::Kind};

use super::plan::Planned;
use crate::algorithm::{Algorithm, ChargeMode};
use crate::pb::rate_limit_response::{Code, DescriptorStatus};
use crate::pb::{RateLimitDescriptor, RateLimitRequest, RateLimitUnit};

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

/// What each concurrency charge of the call took, by its descriptor's keys joined with `.`
/// (`user`, `user.model`; a second descriptor of the same keys in the call `user#2`, a third
/// `user#3`): `held`, its slots (its hits when charged, 0 when refused or not charged: a probe, an
/// all-or-nothing call refused), and `lease`, the token naming the leases it took (0 when it took
/// none), which a release gives back to free those and no other. Empty when the call has no
/// concurrency charge. Numbers as text: Envoy's `%DYNAMIC_METADATA(...)%` prints a string as it
/// is.
pub(super) fn held(
    request: &RateLimitRequest,
    planned: &[Planned],
    charge: ChargeMode,
    refused: bool,
) -> Vec<(String, Value)> {
    let charged = match charge {
        ChargeMode::Probe => false,
        ChargeMode::AllOrNothing => !refused,
        ChargeMode::EachAlone => true,
    };
    let (mut held, mut leases) = (BTreeMap::new(), BTreeMap::new());
    let names = descriptor_names(&request.descriptors);
    for (name, p) in names.into_iter().zip(planned) {
        let concurrency = p
            .check
            .iter()
            .map(|c| (c, p.decision))
            .chain(p.layers.iter().map(|l| (&l.check, l.decision)))
            .find(|(c, _)| c.limit.algorithm == Algorithm::Concurrency);
        let Some((_, decision)) = concurrency.filter(|_| !p.refund) else {
            continue;
        };
        // The call's answer for the descriptor (a layered one: its binding layer) says whether
        // it passed; the concurrency check's own decision names the lease.
        let took = match (p.decision, decision) {
            (Some(overall), Some(own))
                if overall.allowed && charged && !overall.by_failure_mode && own.allowed =>
            {
                Some((p.hits, own.lease.unwrap_or(0)))
            }
            _ => None,
        };
        let (slots, lease) = took.unwrap_or((0, 0));
        held.insert(name.clone(), text(slots.to_string()));
        leases.insert(name, text(lease.to_string()));
    }
    if held.is_empty() {
        return Vec::new();
    }
    vec![
        ("held".to_owned(), object(held)),
        ("lease".to_owned(), object(leases)),
    ]
}

/// Each descriptor's name in `held` and `lease`: its keys joined with `.`, and where an earlier
/// descriptor of the call has the same keys (concurrency or not), `#2`, `#3`, … by its place among
/// them. One function for the service and for `portcullis ask`, which releases by these names.
pub fn descriptor_names(descriptors: &[RateLimitDescriptor]) -> Vec<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    descriptors
        .iter()
        .map(|d| {
            let name = d
                .entries
                .iter()
                .map(|e| e.key.as_str())
                .collect::<Vec<_>>()
                .join(".");
            let nth = seen.entry(name.clone()).or_insert(0);
            *nth += 1;
            if *nth > 1 {
                format!("{name}#{nth}")
            } else {
                name
            }
        })
        .collect()
}
