//! The Go service's names and labels, as its statsd and Prometheus sinks write them.

use super::*;

#[test]
fn stat_names_are_sanitized_like_the_go_service() {
    assert_eq!(
        sanitize_stat_name("edge.remote_address_10.1.2.3"),
        "edge.remote_address_10_1_2_3"
    );
    assert_eq!(sanitize_stat_name("edge.k_a:b|c"), "edge.k_a_b_c");
    assert_eq!(sanitize_stat_name("edge.path_/v1.2"), "edge.path_/v1.2");
    assert_eq!(sanitize_stat_name("x.1234.5.6.7"), "x.1234_5_6_7");
    assert_eq!(sanitize_stat_name("1.2.3.4567.8"), "1_2_3_4567.8");
}

#[test]
fn rule_counters_map_to_the_go_sinks_names_and_labels() {
    let metrics = Metrics::default();
    let labels = |rule: &str| crate::telemetry::RuleLabels {
        domain: "edge".into(),
        rule: rule.into(),
    };
    metrics
        .rule_hits
        .get_or_create(&labels("edge.remote_address"))
        .inc_by(3);
    metrics
        .rule_hits
        .get_or_create(&labels("edge.api_key.path_/api/orders/*"))
        .inc_by(2);
    metrics
        .rule_over_limit
        .get_or_create(&labels("edge.remote_address"))
        .inc();
    let statsd = statsd_counters(&metrics);
    assert_eq!(
        statsd["ratelimit.service.rate_limit.edge.remote_address.total_hits"],
        3
    );
    assert_eq!(
        statsd["ratelimit.service.rate_limit.edge.api_key.path_/api/orders/*.total_hits"],
        2
    );
    let text = prometheus_text(&metrics);
    assert!(
        text.contains(
            "ratelimit_service_rate_limit_total_hits{domain=\"edge\",key1=\"remote_address\"} 3"
        ),
        "{text}"
    );
    assert!(
        text.contains("ratelimit_service_rate_limit_total_hits{domain=\"edge\",key1=\"api_key\",key2=\"path_/api/orders/*\"} 2"),
        "{text}"
    );
    assert!(
        text.contains(
            "ratelimit_service_rate_limit_over_limit{domain=\"edge\",key1=\"remote_address\"} 1"
        ),
        "{text}"
    );
}
