//! The proto3 JSON mapping of RateLimitRequest and RateLimitResponse, for the admin `/json`
//! endpoint: field names in lowerCamelCase (the original snake_case names are accepted too),
//! enums as names (numbers accepted), 64-bit integers as strings (numbers accepted), durations as
//! `"<seconds>s"`. Written by hand for these few messages rather than generating serde code for
//! every proto type.

use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::pb::rate_limit_descriptor::{Entry, RateLimitOverride};
use crate::pb::rate_limit_response::{Code, rate_limit::Unit};
use crate::pb::{RateLimitDescriptor, RateLimitRequest, RateLimitResponse, RateLimitUnit};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RequestJson {
    #[serde(default)]
    domain: String,
    #[serde(default)]
    descriptors: Vec<DescriptorJson>,
    #[serde(default, alias = "hits_addend", rename = "hitsAddend")]
    hits_addend: Option<Number>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DescriptorJson {
    #[serde(default)]
    entries: Vec<EntryJson>,
    #[serde(default)]
    limit: Option<OverrideJson>,
    #[serde(default, alias = "hits_addend", rename = "hitsAddend")]
    hits_addend: Option<Number>,
    #[serde(default, alias = "is_negative_hits", rename = "isNegativeHits")]
    is_negative_hits: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EntryJson {
    #[serde(default)]
    key: String,
    #[serde(default)]
    value: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct OverrideJson {
    #[serde(default, alias = "requests_per_unit", rename = "requestsPerUnit")]
    requests_per_unit: Option<Number>,
    #[serde(default)]
    unit: Option<Value>,
}

/// A proto3 JSON integer: a number or a decimal string.
#[derive(Deserialize)]
#[serde(untagged)]
enum Number {
    Int(u64),
    Text(String),
}

impl Number {
    fn get(&self, field: &str) -> Result<u64, String> {
        match self {
            Number::Int(v) => Ok(*v),
            Number::Text(t) => t
                .parse()
                .map_err(|_| format!("{field}: {t:?} is not a non-negative integer")),
        }
    }
}

fn unit_from_json(value: &Value) -> Result<i32, String> {
    match value {
        Value::Number(n) => n
            .as_i64()
            .and_then(|n| i32::try_from(n).ok())
            .ok_or_else(|| format!("limit.unit: {n} is not a unit")),
        Value::String(s) => RateLimitUnit::from_str_name(s)
            .map(|u| u as i32)
            .ok_or_else(|| {
                format!(
                    "limit.unit: {s:?} is not one of SECOND, MINUTE, HOUR, DAY, WEEK, MONTH, YEAR"
                )
            }),
        other => Err(format!("limit.unit: {other} is not a unit")),
    }
}

/// Parses a proto3-JSON RateLimitRequest; the error says what is wrong.
pub fn request_from_json(body: &[u8]) -> Result<RateLimitRequest, String> {
    let parsed: RequestJson = serde_json::from_slice(body)
        .map_err(|e| format!("request is not a RateLimitRequest: {e}"))?;
    let hits_addend = match &parsed.hits_addend {
        Some(n) => u32::try_from(n.get("hitsAddend")?)
            .map_err(|_| "hitsAddend: above 4294967295".to_owned())?,
        None => 0,
    };
    let mut descriptors = Vec::with_capacity(parsed.descriptors.len());
    for (i, d) in parsed.descriptors.into_iter().enumerate() {
        let limit = match d.limit {
            Some(o) => Some(RateLimitOverride {
                requests_per_unit: match &o.requests_per_unit {
                    Some(n) => u32::try_from(n.get("requestsPerUnit")?).map_err(|_| {
                        format!("descriptors[{i}].limit.requestsPerUnit: above 4294967295")
                    })?,
                    None => 0,
                },
                unit: match &o.unit {
                    Some(u) => unit_from_json(u).map_err(|e| format!("descriptors[{i}].{e}"))?,
                    None => 0,
                },
            }),
            None => None,
        };
        descriptors.push(RateLimitDescriptor {
            entries: d
                .entries
                .into_iter()
                .map(|e| Entry {
                    key: e.key,
                    value: e.value,
                })
                .collect(),
            limit,
            hits_addend: d
                .hits_addend
                .map(|n| n.get(&format!("descriptors[{i}].hitsAddend")))
                .transpose()?,
            is_negative_hits: d.is_negative_hits,
        });
    }
    Ok(RateLimitRequest {
        domain: parsed.domain,
        descriptors,
        hits_addend,
    })
}

fn code_name(code: i32) -> &'static str {
    Code::try_from(code).map_or("UNKNOWN", |c| c.as_str_name())
}

/// The proto3-JSON form of a response.
pub fn response_to_json(response: &RateLimitResponse) -> String {
    let statuses: Vec<Value> = response
        .statuses
        .iter()
        .map(|s| {
            let mut status = Map::new();
            status.insert("code".into(), json!(code_name(s.code)));
            if let Some(limit) = &s.current_limit {
                let mut l = Map::new();
                if !limit.name.is_empty() {
                    l.insert("name".into(), json!(limit.name));
                }
                l.insert("requestsPerUnit".into(), json!(limit.requests_per_unit));
                l.insert(
                    "unit".into(),
                    json!(Unit::try_from(limit.unit).map_or("UNKNOWN", |u| u.as_str_name())),
                );
                status.insert("currentLimit".into(), Value::Object(l));
            }
            status.insert("limitRemaining".into(), json!(s.limit_remaining));
            if let Some(d) = &s.duration_until_reset {
                status.insert(
                    "durationUntilReset".into(),
                    json!(format!("{}s", d.seconds)),
                );
            }
            Value::Object(status)
        })
        .collect();
    let mut out = Map::new();
    out.insert(
        "overallCode".into(),
        json!(code_name(response.overall_code)),
    );
    out.insert("statuses".into(), Value::Array(statuses));
    if !response.response_headers_to_add.is_empty() {
        let headers: Vec<Value> = response
            .response_headers_to_add
            .iter()
            .map(|h| json!({ "key": h.key, "value": h.value }))
            .collect();
        out.insert("responseHeadersToAdd".into(), Value::Array(headers));
    }
    Value::Object(out).to_string()
}
