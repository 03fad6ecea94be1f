//! An RLQS bucket id matched against a domain's rules. A bucket id is a map (its keys have no
//! order), a descriptor is a list: the bucket's entries are put in the order the rules nest
//! them, level by level, and that descriptor is then resolved as RLS resolves one. It must never
//! search without bound: a crafted bucket id gets "no rule", never a long walk.

use super::Snapshot;
use super::tree::Level;

impl Snapshot {
    /// The bucket's entries in the order of a rule that matches all of them at full depth (at
    /// each level the keys that level defines, in name order, values matched as RLS matches
    /// them), or `None` when no rule does.
    pub fn bucket_descriptor(
        &self,
        domain: &str,
        bucket: &[(String, String)],
    ) -> Option<Vec<(String, String)>> {
        let root = &self.domains.get(domain)?.root;
        let mut remaining: Vec<&(String, String)> = bucket.iter().collect();
        remaining.sort();
        let mut path = Vec::with_capacity(bucket.len());
        walk(root, &mut remaining, &mut path).then(|| path.into_iter().cloned().collect())
    }
}

fn walk<'a>(
    level: &Level,
    remaining: &mut Vec<&'a (String, String)>,
    path: &mut Vec<&'a (String, String)>,
) -> bool {
    for i in 0..remaining.len() {
        let entry = remaining[i];
        let Some((node, _)) = level.find(&entry.0, &entry.1) else {
            continue;
        };
        remaining.remove(i);
        path.push(entry);
        let found = if remaining.is_empty() {
            node.rule.is_some()
        } else {
            walk(&node.children, remaining, path)
        };
        if found {
            return true;
        }
        path.pop();
        remaining.insert(i, entry);
    }
    false
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use crate::rules::{LoadOptions, Lookup, RuleFiles, parse};

    fn bucket(entries: &[(&str, &str)]) -> Vec<(String, String)> {
        entries
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn a_bucket_takes_the_order_of_the_rule_it_matches() {
        let yaml = "domain: d\ndescriptors:\n  - key: tenant\n    descriptors:\n      - key: path\n        value: /api/*\n        rate_limit: {unit: second, requests_per_unit: 5}\n  - key: path\n    value: /login\n    rate_limit: {unit: minute, requests_per_unit: 3}\n";
        let files = RuleFiles {
            files: vec![(PathBuf::from("d.yaml"), yaml.as_bytes().to_vec())],
        };
        let snapshot = parse(&files, LoadOptions::default()).unwrap();
        // The map's keys sort as path, tenant; the rule nests tenant, then path.
        let ordered = snapshot
            .bucket_descriptor("d", &bucket(&[("path", "/api/x"), ("tenant", "t1")]))
            .expect("a rule");
        assert_eq!(ordered, bucket(&[("tenant", "t1"), ("path", "/api/x")]));
        let Lookup::Rule(found) = snapshot.resolve("d", &ordered) else {
            panic!("resolves")
        };
        assert_eq!(found.rule.requests_per_unit, 5);
        assert_eq!(
            snapshot.bucket_descriptor("d", &bucket(&[("path", "/login")])),
            Some(bucket(&[("path", "/login")]))
        );
        // Every entry must be used: an extra key, a value no rule matches, or a level without a
        // rule is no rule at all.
        for b in [
            bucket(&[("path", "/login"), ("colour", "blue")]),
            bucket(&[("tenant", "t1"), ("path", "/other")]),
            bucket(&[("tenant", "t1")]),
        ] {
            assert_eq!(snapshot.bucket_descriptor("d", &b), None, "{b:?}");
        }
        assert_eq!(
            snapshot.bucket_descriptor("nope", &bucket(&[("path", "/login")])),
            None
        );
    }
}
