//! The load benchmark's tables: each row against its ceilings, and each build against this one.

use super::*;

pub fn print(rows: &[Row], null: &Row, ceiling: (f64, f64), generator_is_h2load: bool) {
    println!();
    println!(
        "Redis ceiling: redis-benchmark EVALSHA of a minimal GCRA script, {:.0} calls/s, {:.2} µs of Redis CPU per call",
        ceiling.0, ceiling.1
    );
    println!(
        "gRPC ceiling: a null tonic server, {:.0} calls/s, {:.1} µs of server CPU per call",
        null.decisions_per_s, null.server_us
    );
    if generator_is_h2load {
        println!(
            "Generator: h2load for the unpaced rows of one request shape (p50 holds h2load's mean; no percentiles), tonic for the rest"
        );
    }
    println!();
    // × memory: against the same build's memory store on one descriptor.
    let memory_one = |binary: &str| {
        rows.iter()
            .find(|r| r.binary == binary && r.store == "memory" && r.scenario == ALL[0].label())
            .map(|r| r.decisions_per_s)
    };
    println!(
        "| build | store | scenario | decisions/s | × null | × memory | p50 ms | p99 ms | p99.9 ms | server µs/decision | × null | Redis µs/decision | Redis µs/script call | × minimal script | redis-server CPU µs/decision | check |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for r in rows {
        let opt =
            |v: Option<f64>, digits: usize| v.map_or("—".to_owned(), |v| format!("{v:.digits$}"));
        println!(
            "| {} | {} | {} | {:.0} | {:.2} | {} | {:.2} | {:.2} | {:.2} | {:.1} | {:.2} | {} | {} | {} | {} | {} |",
            r.binary,
            r.store,
            r.scenario,
            r.decisions_per_s,
            r.decisions_per_s / null.decisions_per_s,
            opt(memory_one(&r.binary).map(|m| r.decisions_per_s / m), 2),
            r.p50,
            r.p99,
            r.p999,
            r.server_us,
            r.server_us / null.server_us,
            opt(r.redis_us, 2),
            opt(r.redis_us_per_script, 2),
            opt(r.redis_us.map(|u| u / ceiling.1), 2),
            opt(r.redis_cpu_us, 2),
            r.check
        );
    }
    print_comparison(rows);
}

/// Each other build's figures as ratios of this build's (below 1: this build spends less, or
/// answers fewer decisions a second): the median over the rounds, and their range.
pub fn print_comparison(rows: &[Row]) {
    let mut groups: Vec<(&str, &str, &str)> = Vec::new();
    for r in rows.iter().filter(|r| r.binary != "this build") {
        let group = (r.store.as_str(), r.scenario.as_str(), r.binary.as_str());
        if !groups.contains(&group) {
            groups.push(group);
        }
    }
    if groups.is_empty() {
        return;
    }
    println!();
    println!(
        "| store | scenario | this build ÷ | rounds | decisions/s | server µs/decision | Redis µs/decision | redis-server CPU µs/decision |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for (store, scenario, other) in groups {
        let pairs: Vec<(&Row, &Row)> = rows
            .iter()
            .filter(|r| r.binary == other && r.store == store && r.scenario == scenario)
            .filter_map(|o| {
                rows.iter()
                    .find(|t| {
                        t.binary == "this build"
                            && t.store == store
                            && t.scenario == scenario
                            && t.round == o.round
                    })
                    .map(|t| (t, o))
            })
            .collect();
        // A paced row's label names its own rate: it has no pair.
        if pairs.is_empty() {
            continue;
        }
        let summary = |ratio: &dyn Fn(&Row, &Row) -> Option<f64>| {
            let mut values: Vec<f64> = pairs.iter().filter_map(|(t, o)| ratio(t, o)).collect();
            if values.is_empty() {
                return "—".to_owned();
            }
            values.sort_by(f64::total_cmp);
            let median = values[values.len() / 2];
            if values.len() == 1 {
                format!("{median:.2}")
            } else {
                format!(
                    "{median:.2} ({:.2}–{:.2})",
                    values[0],
                    values[values.len() - 1]
                )
            }
        };
        println!(
            "| {store} | {scenario} | {other} | {} | {} | {} | {} | {} |",
            pairs.len(),
            summary(&|t, o| Some(t.decisions_per_s / o.decisions_per_s)),
            summary(&|t, o| Some(t.server_us / o.server_us)),
            summary(&|t, o| Some(t.redis_us? / o.redis_us?)),
            summary(&|t, o| Some(t.redis_cpu_us? / o.redis_cpu_us?)),
        );
    }
}
