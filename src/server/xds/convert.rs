//! A pushed set of `RateLimitConfig` resources turned into rule files, so that it is validated by
//! exactly the code that validates files on disk (every field, every error with its place). Each
//! resource becomes one document in the rules format, named `xds:<resource name>`, with the
//! field names of the YAML it stands for; the Go service converts the same way.
//!
//! It must never drop or invent a field: a value the proto cannot leave unset (`unit`,
//! `requests_per_unit`) is written only when it means something, as the YAML would.

use std::path::PathBuf;

use prost::Message;
use prost_types::value::Kind;
use serde_json::{Map, Value, json};

use crate::pb::xds::{RULES_TYPE_URL, rules as pb};
use crate::rules::RuleFiles;

/// The rule files of one pushed set, in the order the server sent them.
pub fn rule_files(resources: &[prost_types::Any]) -> Result<RuleFiles, String> {
    let mut files = Vec::with_capacity(resources.len());
    for (index, any) in resources.iter().enumerate() {
        if any.type_url != RULES_TYPE_URL {
            return Err(format!(
                "resource {index} has type {:?}, expected {RULES_TYPE_URL}",
                any.type_url
            ));
        }
        let config = pb::RateLimitConfig::decode(any.value.as_slice())
            .map_err(|e| format!("resource {index} is not a RateLimitConfig: {e}"))?;
        let name = if config.name.is_empty() {
            format!("#{index}")
        } else {
            config.name.clone()
        };
        // Pretty, so that an error's line points somewhere a person can find.
        let text = serde_json::to_string_pretty(&document(&config))
            .map_err(|e| format!("resource {name:?}: {e}"))?;
        files.push((PathBuf::from(format!("xds:{name}")), text.into_bytes()));
    }
    Ok(RuleFiles { files })
}

/// One resource as the rules file it stands for (JSON is YAML).
fn document(config: &pb::RateLimitConfig) -> Value {
    json!({
        "domain": config.domain,
        "descriptors": config.descriptors.iter().map(descriptor).collect::<Vec<_>>(),
    })
}

fn descriptor(d: &pb::RateLimitDescriptor) -> Value {
    let mut out = Map::new();
    out.insert("key".into(), d.key.clone().into());
    if !d.value.is_empty() {
        out.insert("value".into(), d.value.clone().into());
    }
    if let Some(policy) = &d.rate_limit {
        out.insert("rate_limit".into(), rate_limit(policy));
    }
    if !d.descriptors.is_empty() {
        out.insert(
            "descriptors".into(),
            d.descriptors.iter().map(descriptor).collect(),
        );
    }
    for (field, set) in [
        ("shadow_mode", d.shadow_mode),
        ("detailed_metric", d.detailed_metric),
        ("quota_mode", d.quota_mode),
    ] {
        if set {
            out.insert(field.into(), true.into());
        }
    }
    if let Some(metadata) = &d.metadata {
        out.insert("metadata".into(), structure(metadata));
    }
    Value::Object(out)
}

fn rate_limit(p: &pb::RateLimitPolicy) -> Value {
    let mut out = Map::new();
    let unit = pb::RateLimitUnit::try_from(p.unit).ok();
    match unit {
        // UNKNOWN is the proto's "not set".
        Some(pb::RateLimitUnit::Unknown) => {}
        Some(unit) => {
            out.insert("unit".into(), unit.as_str_name().into());
        }
        // A number this proto does not know: passed on, so that validation names it.
        None => {
            out.insert("unit".into(), format!("unit #{}", p.unit).into());
        }
    }
    // Zero is the proto's "not set"; for a limited rule it means what a missing count means.
    if p.requests_per_unit != 0 || !p.unlimited {
        out.insert("requests_per_unit".into(), p.requests_per_unit.into());
    }
    if p.unlimited {
        out.insert("unlimited".into(), true.into());
    }
    if !p.name.is_empty() {
        out.insert("name".into(), p.name.clone().into());
    }
    if !p.replaces.is_empty() {
        out.insert(
            "replaces".into(),
            p.replaces
                .iter()
                .map(|r| json!({ "name": r.name }))
                .collect(),
        );
    }
    Value::Object(out)
}

fn structure(s: &prost_types::Struct) -> Value {
    Value::Object(
        s.fields
            .iter()
            .map(|(k, v)| (k.clone(), value(v)))
            .collect(),
    )
}

fn value(v: &prost_types::Value) -> Value {
    match &v.kind {
        None | Some(Kind::NullValue(_)) => Value::Null,
        Some(Kind::NumberValue(n)) => {
            serde_json::Number::from_f64(*n).map_or(Value::Null, Value::Number)
        }
        Some(Kind::StringValue(s)) => s.clone().into(),
        Some(Kind::BoolValue(b)) => (*b).into(),
        Some(Kind::StructValue(s)) => structure(s),
        Some(Kind::ListValue(l)) => l.values.iter().map(value).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Algorithm;
    use crate::rules::{LoadOptions, parse};

    fn any(config: &pb::RateLimitConfig) -> prost_types::Any {
        prost_types::Any {
            type_url: RULES_TYPE_URL.into(),
            value: config.encode_to_vec(),
        }
    }

    fn limited(unit: pb::RateLimitUnit, requests: u32) -> Option<pb::RateLimitPolicy> {
        Some(pb::RateLimitPolicy {
            unit: unit as i32,
            requests_per_unit: requests,
            ..Default::default()
        })
    }

    const OPTIONS: LoadOptions = LoadOptions {
        merge_domains: false,
        default_algorithm: Algorithm::FixedWindow,
    };

    #[test]
    fn every_field_reaches_the_rules() {
        let config = pb::RateLimitConfig {
            name: "default/eg/http".into(),
            domain: "eg".into(),
            descriptors: vec![pb::RateLimitDescriptor {
                key: "client".into(),
                value: "acme".into(),
                rate_limit: Some(pb::RateLimitPolicy {
                    unit: pb::RateLimitUnit::Week as i32,
                    requests_per_unit: 7,
                    name: "acme-weekly".into(),
                    ..Default::default()
                }),
                descriptors: vec![pb::RateLimitDescriptor {
                    key: "path".into(),
                    rate_limit: Some(pb::RateLimitPolicy {
                        unlimited: true,
                        replaces: vec![pb::RateLimitReplace {
                            name: "acme-weekly".into(),
                        }],
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
                shadow_mode: true,
                detailed_metric: true,
                quota_mode: true,
                metadata: Some(prost_types::Struct {
                    fields: [(
                        "tier".to_owned(),
                        prost_types::Value {
                            kind: Some(Kind::StringValue("gold".into())),
                        },
                    )]
                    .into(),
                }),
            }],
        };
        let files = rule_files(&[any(&config)]).unwrap();
        assert_eq!(files.files[0].0, PathBuf::from("xds:default/eg/http"));
        let snapshot = parse(&files, OPTIONS).expect("valid");
        let listing: Vec<String> = snapshot.rules().iter().map(|r| r.describe()).collect();
        let all = listing.join("\n");
        assert!(all.contains("eg.client_acme"), "{all}");
        assert!(all.contains("week"), "{all}");
        assert!(all.contains("unlimited"), "{all}");
        let text = String::from_utf8(files.files[0].1.clone()).unwrap();
        for field in [
            "shadow_mode",
            "detailed_metric",
            "quota_mode",
            "\"tier\": \"gold\"",
        ] {
            assert!(text.contains(field), "{field} in {text}");
        }
    }

    #[test]
    fn an_invalid_set_is_refused_with_its_place() {
        // A limited rule without a unit: the YAML's own error, naming the resource.
        let config = pb::RateLimitConfig {
            name: "broken".into(),
            domain: "eg".into(),
            descriptors: vec![pb::RateLimitDescriptor {
                key: "k".into(),
                rate_limit: limited(pb::RateLimitUnit::Unknown, 5),
                ..Default::default()
            }],
        };
        let files = rule_files(&[any(&config)]).unwrap();
        let error = parse(&files, OPTIONS).unwrap_err().to_string();
        assert!(error.contains("xds:broken"), "{error}");
        assert!(error.contains("unit"), "{error}");

        let wrong_type = prost_types::Any {
            type_url: "type.googleapis.com/envoy.config.cluster.v3.Cluster".into(),
            value: Vec::new(),
        };
        assert!(rule_files(&[wrong_type]).unwrap_err().contains("Cluster"));
        let garbage = prost_types::Any {
            type_url: RULES_TYPE_URL.into(),
            value: vec![0xff, 0xff, 0xff],
        };
        assert!(
            rule_files(&[garbage])
                .unwrap_err()
                .contains("not a RateLimitConfig")
        );
    }

    #[test]
    fn two_resources_for_one_domain_follow_the_merge_setting() {
        let part = |name: &str, key: &str| pb::RateLimitConfig {
            name: name.into(),
            domain: "eg".into(),
            descriptors: vec![pb::RateLimitDescriptor {
                key: key.into(),
                rate_limit: limited(pb::RateLimitUnit::Second, 1),
                ..Default::default()
            }],
        };
        let files = rule_files(&[any(&part("a", "x")), any(&part("b", "y"))]).unwrap();
        assert!(parse(&files, OPTIONS).is_err());
        let merged = LoadOptions {
            merge_domains: true,
            ..OPTIONS
        };
        assert_eq!(parse(&files, merged).unwrap().rules().len(), 2);
    }
}
