//! The service end to end over real gRPC on loopback: what a gateway sees for each rule feature,
//! the matching semantics of envoyproxy/ratelimit, and bad input.

use crate::common;
mod counting;
mod leases;
mod matching;
mod modes;

use crate::common::{TestServer, descriptor, header, request};
use portcullis::pb::rate_limit_descriptor::RateLimitOverride;
use portcullis::pb::rate_limit_response::{Code, rate_limit::Unit};
use portcullis::pb::{RateLimitRequest, RateLimitResponse, RateLimitUnit};
use portcullis::service::HeadersMode;

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

fn codes(r: &RateLimitResponse) -> Vec<i32> {
    r.statuses.iter().map(|s| s.code).collect()
}

/// The dynamic metadata's `field` map (`held` or `lease`), as (descriptor name, text) by name.
fn meta(r: &RateLimitResponse, field: &str) -> Vec<(String, String)> {
    let Some(meta) = &r.dynamic_metadata else {
        return Vec::new();
    };
    let Some(prost_types::value::Kind::StructValue(map)) =
        meta.fields.get(field).and_then(|v| v.kind.clone())
    else {
        return Vec::new();
    };
    map.fields
        .into_iter()
        .map(|(k, v)| match v.kind {
            Some(prost_types::value::Kind::StringValue(s)) => (k, s),
            other => panic!("{field}.{k}: {other:?}"),
        })
        .collect()
}

const BASIC: &str = r#"
domain: basic
descriptors:
  - key: key1
    rate_limit:
      unit: minute
      requests_per_unit: 3
  - key: key1
    value: special
    rate_limit:
      name: special
      unit: hour
      requests_per_unit: 1
  - key: nested
    descriptors:
      - key: leaf
        rate_limit:
          unit: second
          requests_per_unit: 1
  - key: deep
    value: v
    rate_limit:
      unit: minute
      requests_per_unit: 1
"#;
