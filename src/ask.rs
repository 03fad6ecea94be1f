//! `portcullis ask`: one ShouldRateLimit request to a running replica, its answer printed, and
//! the exit code a script reads (0 OK, 1 OVER_LIMIT, 2 no answer). It stands for a request that
//! ends when answered: it must never keep a concurrency slot (it gives back what it took), and
//! with `--probe` it spends nothing.

use std::process::ExitCode;

pub fn ask(
    addr: String,
    domain: String,
    hits: u32,
    probe: bool,
    descriptors: Vec<Vec<(String, String)>>,
) -> ExitCode {
    use portcullis::pb::{
        RateLimitDescriptor, RateLimitRequest, RateLimitServiceClient,
        rate_limit_descriptor::Entry,
        rate_limit_response::{Code, rate_limit::Unit},
    };
    let request = RateLimitRequest {
        domain,
        hits_addend: hits,
        descriptors: descriptors
            .iter()
            .map(|entries| RateLimitDescriptor {
                entries: entries
                    .iter()
                    .map(|(key, value)| Entry {
                        key: key.clone(),
                        value: value.clone(),
                    })
                    .collect(),
                // A check-only call: answered as a request would be, nothing spent or taken.
                hits_addend: probe.then_some(0),
                ..Default::default()
            })
            .collect(),
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("portcullis: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // `host:port` as people write it; a URL as given.
    let addr = if addr.contains("://") {
        addr
    } else {
        format!("http://{addr}")
    };
    let answer = runtime.block_on(async {
        let mut client = RateLimitServiceClient::connect(addr.clone())
            .await
            .map_err(|e| format!("cannot connect to {addr}: {e}"))?;
        let response = client
            .should_rate_limit(request.clone())
            .await
            .map(|r| r.into_inner())
            .map_err(|s| format!("{:?}: {}", s.code(), s.message()))?;
        // `ask` stands for a request that ends when it is answered: a concurrency slot it took
        // is given back at once, as Envoy's release would, never held for its lease.
        let held = metadata_numbers(&response, "held");
        let leases = metadata_numbers(&response, "lease");
        // Named as the service names them: a second descriptor of the same keys `keys#2`.
        let names = portcullis::service::descriptor_names(&request.descriptors);
        for (descriptor, name) in request.descriptors.iter().zip(names) {
            let slots = held.get(&name).copied().unwrap_or(0);
            let Some(&lease) = leases.get(&name).filter(|n| **n > 0 && slots > 0) else {
                continue;
            };
            let release = RateLimitRequest {
                domain: request.domain.clone(),
                hits_addend: 0,
                descriptors: vec![RateLimitDescriptor {
                    // The lease it took, and no other request's.
                    hits_addend: Some(lease),
                    is_negative_hits: true,
                    ..descriptor.clone()
                }],
            };
            match client.should_rate_limit(release).await {
                Ok(_) => println!("released: {slots} concurrency slot(s) of {name}"),
                Err(s) => eprintln!(
                    "portcullis: the {slots} concurrency slot(s) of {name} were not given back \
                     ({:?}: {}); they end with their lease",
                    s.code(),
                    s.message()
                ),
            }
        }
        Ok::<_, String>(response)
    });
    let response = match answer {
        Ok(r) => r,
        Err(e) => {
            eprintln!("portcullis: {e}");
            return ExitCode::from(ASK_FAILED);
        }
    };
    let code_name = |code: i32| Code::try_from(code).map_or("UNKNOWN", |c| c.as_str_name());
    println!("overall: {}", code_name(response.overall_code));
    for (entries, status) in descriptors.iter().zip(&response.statuses) {
        let shown: Vec<String> = entries.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let mut line = format!("  {}: {}", shown.join(","), code_name(status.code));
        if let Some(limit) = &status.current_limit {
            let unit = Unit::try_from(limit.unit).map_or("?", |u| u.as_str_name());
            line.push_str(&format!(
                ", limit {}/{}, remaining {}, reset in {}s",
                limit.requests_per_unit,
                unit.to_lowercase(),
                status.limit_remaining,
                status.duration_until_reset.map_or(0, |d| d.seconds)
            ));
            if !limit.name.is_empty() {
                line.push_str(&format!(" ({})", limit.name));
            }
        }
        println!("{line}");
    }
    for header in &response.response_headers_to_add {
        println!("  header {}: {}", header.key, header.value);
    }
    if response.overall_code == Code::OverLimit as i32 {
        ExitCode::from(ASK_OVER_LIMIT)
    } else {
        ExitCode::SUCCESS
    }
}

/// What an answer's dynamic metadata says of its concurrency takes (`held`: the slots, `lease`:
/// the leases' name), by the descriptor's keys joined with `.`.
fn metadata_numbers(
    response: &portcullis::pb::RateLimitResponse,
    field: &str,
) -> std::collections::BTreeMap<String, u64> {
    use prost_types::value::Kind;
    let Some(Kind::StructValue(held)) = response
        .dynamic_metadata
        .as_ref()
        .and_then(|m| m.fields.get(field))
        .and_then(|v| v.kind.clone())
    else {
        return Default::default();
    };
    held.fields
        .into_iter()
        .filter_map(|(name, value)| match value.kind {
            Some(Kind::StringValue(n)) => Some((name, n.parse().ok()?)),
            _ => None,
        })
        .collect()
}

/// `ask`'s exit codes past 0 (OK): over the limit, and no answer (as `test` uses 1 and 2).
const ASK_OVER_LIMIT: u8 = 1;
const ASK_FAILED: u8 = 2;
