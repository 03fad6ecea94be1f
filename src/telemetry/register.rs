//! Registering a metric under its Prometheus name while keeping the list of names it is exported
//! under, for the tests and tooling that check dashboards and alerts against what exists. It must
//! never register a name twice (the registry would export both).

use prometheus_client::registry::Registry;

/// Registers one metric and remembers the names it is exported under (for tooling that checks
/// dashboards and alerts against what exists).
pub(super) fn register<M>(
    registry: &mut Registry,
    names: &mut Vec<String>,
    name: &str,
    help: &str,
    metric: M,
) where
    M: prometheus_client::registry::Metric,
{
    let full = format!("portcullis_{name}");
    match metric.metric_type() {
        prometheus_client::metrics::MetricType::Counter => names.push(format!("{full}_total")),
        prometheus_client::metrics::MetricType::Histogram => {
            for suffix in ["_bucket", "_sum", "_count"] {
                names.push(format!("{full}{suffix}"));
            }
        }
        _ => names.push(full),
    }
    registry.register(name, help, metric);
}
