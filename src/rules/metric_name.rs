//! The Go service's per-rule metric names where they are made of request values
//! (`detailed_metric`, `value_to_metric`, shared wildcards by their pattern). It must never name
//! a series by a value no rule asked for.

use super::model::Rule;
use super::tree::{Entry, Matched, Node};

/// The Go service's per-rule metric name where it is not the configured `full_key`:
/// `detailed_metric` names every level by the request's value (a shared level by its pattern);
/// otherwise a `value_to_metric` level puts the request's value where the configuration has a
/// wildcard or nothing.
pub(super) fn metric_name<E: Entry>(
    domain: &str,
    entries: &[E],
    path: &[(Matched<'_>, &Node)],
    rule: &Rule,
    shared: &[(usize, &str)],
) -> Option<String> {
    let pattern_at = |i: usize| shared.iter().find(|(s, _)| *s == i).map(|(_, p)| *p);
    let mut name = String::from(domain);
    if rule.detailed_metric {
        for (i, e) in entries.iter().enumerate() {
            name.push('.');
            name.push_str(e.key());
            match pattern_at(i) {
                Some(pattern) => {
                    name.push('_');
                    name.push_str(pattern);
                }
                // Go writes `key_` even for an empty value here (and not on the shared path).
                None if shared.is_empty() => {
                    name.push('_');
                    name.push_str(e.value());
                }
                None if !e.value().is_empty() => {
                    name.push('_');
                    name.push_str(e.value());
                }
                None => {}
            }
        }
        return Some(name);
    }
    if !path.iter().any(|(_, node)| node.value_to_metric) {
        return None;
    }
    for ((matched, node), e) in path.iter().zip(entries) {
        let value = match matched {
            Matched::Wildcard(pattern) if node.share_threshold => pattern,
            Matched::Wildcard(_) if node.value_to_metric => e.value(),
            Matched::Wildcard(pattern) => pattern,
            Matched::Exact => e.value(),
            Matched::Default if node.value_to_metric => e.value(),
            Matched::Default => "",
        };
        name.push('.');
        name.push_str(e.key());
        if !value.is_empty() {
            name.push('_');
            name.push_str(value);
        }
    }
    (name != rule.full_key).then_some(name)
}
