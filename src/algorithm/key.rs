//! Counter identity: `{<domain>|<k1>=<v1>|...}:<algorithm>:<window>s[:o<requests>]`.
//!
//! The braces are a Redis Cluster hash tag, so every key of one descriptor lands in one slot. The
//! characters that give the key its structure (`|`, `=`, `{`, `}`) and the escape character `%`
//! are percent-encoded inside names and values: a backslash would not do, because Redis ends a
//! hash tag at the first `}` whatever precedes it. So distinct descriptors never share a key.
//!
//! The rule's algorithm and window are part of the identity (the state means something else
//! under another one), its request count is not (a reload that only changes the number keeps the
//! counters), except for a limit carried by the request: overrides of different sizes count apart.

use std::fmt::Write;

use super::Limit;

fn push_escaped(out: &mut String, text: &str) {
    for ch in text.chars() {
        match ch {
            '%' => out.push_str("%25"),
            '|' => out.push_str("%7C"),
            '=' => out.push_str("%3D"),
            '{' => out.push_str("%7B"),
            '}' => out.push_str("%7D"),
            other => out.push(other),
        }
    }
}

/// Builds the key of one descriptor's counter. `override_requests` is set only for a limit that
/// came with the request.
pub fn counter_key<'a>(
    domain: &str,
    entries: impl IntoIterator<Item = (&'a str, &'a str)>,
    limit: &Limit,
    override_requests: Option<u64>,
) -> String {
    counter_key_parts(
        domain,
        entries
            .into_iter()
            .map(|(name, value)| (name, value, false)),
        limit,
        override_requests,
    )
}

/// Like `counter_key`, with entries as (name, value, shared): a shared entry's value is a
/// `share_threshold` wildcard pattern that every matching value counts under, written `name==`
/// so that it never meets the key of a request whose value is the pattern's text (`=` inside a
/// value is always escaped).
pub fn counter_key_parts<'a>(
    domain: &str,
    entries: impl IntoIterator<Item = (&'a str, &'a str, bool)>,
    limit: &Limit,
    override_requests: Option<u64>,
) -> String {
    let mut key = String::with_capacity(64);
    key.push('{');
    push_escaped(&mut key, domain);
    for (name, value, shared) in entries {
        key.push('|');
        push_escaped(&mut key, name);
        key.push('=');
        if shared {
            key.push('=');
        }
        push_escaped(&mut key, value);
    }
    key.push('}');
    // Writing to a String cannot fail.
    let _ = write!(key, ":{}:{}us", limit.algorithm.tag(), limit.window_us);
    if let Some(requests) = override_requests {
        let _ = write!(key, ":o{requests}");
    }
    key
}

/// The descriptor a counter key belongs to: its hash tag, `{<domain>|<k1>=<v1>|...}` (every
/// layer and algorithm of one descriptor shares it; braces inside names are escaped, so the first
/// `}` ends it). A key without one is its own.
pub fn descriptor_tag(key: &str) -> &str {
    match key.find('}') {
        Some(end) if key.starts_with('{') => &key[..=end],
        _ => key,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_layer_of_a_descriptor_has_its_tag() {
        let second = Limit {
            algorithm: super::super::Algorithm::FixedWindow,
            requests: 10,
            window_us: 1_000_000,
            burst: 10,
        };
        let minute = Limit {
            window_us: 60_000_000,
            ..second
        };
        let a = counter_key("edge", [("user", "a}b")], &second, None);
        let b = counter_key("edge", [("user", "a}b")], &minute, Some(7));
        assert_eq!(descriptor_tag(&a), "{edge|user=a%7Db}");
        assert_eq!(descriptor_tag(&a), descriptor_tag(&b));
        assert_eq!(descriptor_tag("plain"), "plain");
    }
    use crate::algorithm::{Algorithm, US_PER_SECOND};

    const LIMIT: Limit = Limit {
        algorithm: Algorithm::SlidingWindow,
        requests: 10,
        window_us: 60 * US_PER_SECOND,
        burst: 10,
    };

    fn key(domain: &str, entries: &[(&str, &str)]) -> String {
        counter_key(domain, entries.iter().copied(), &LIMIT, None)
    }

    /// The hash tag Redis Cluster would hash: between the first `{` and the next `}`.
    fn hash_tag(key: &str) -> &str {
        let open = key.find('{').expect("open brace");
        let close = key[open + 1..].find('}').expect("close brace") + open + 1;
        &key[open + 1..close]
    }

    #[test]
    fn hostile_values_never_share_a_key_and_keep_one_hash_tag() {
        let long = "v".repeat(64 * 1024);
        let cases: Vec<Vec<(&str, &str)>> = vec![
            vec![("a", "b|c=d")],
            vec![("a", "b"), ("c", "d")],
            vec![("a", "b}"), ("c", "d")],
            vec![("a", "b"), ("}c", "d")],
            vec![("a", "{x}")],
            vec![("a", "x")],
            vec![("a=b", "")],
            vec![("a", "=b")],
            vec![("a", "b\nc")],
            vec![("a", "b%7Cc")],
            vec![("a", "b|c")],
            vec![("a", &long)],
            vec![("a|b", "c")],
            vec![],
        ];
        let keys: Vec<String> = cases.iter().map(|c| key("d", c)).collect();
        for (i, a) in keys.iter().enumerate() {
            for b in &keys[i + 1..] {
                assert_ne!(a, b);
            }
            // The whole descriptor is the hash tag: nothing a value holds can end it early.
            assert!(a.ends_with(":sw60:60000000us"), "{a}");
            assert_eq!(a.matches('{').count(), 1);
            assert_eq!(a.matches('}').count(), 1);
            assert!(hash_tag(a).starts_with('d'));
        }
        assert_ne!(key("a|b", &[]), key("a", &[("b", "")]));
        // A shared (share_threshold) counter never meets a request whose value is the pattern.
        let shared = counter_key_parts("d", [("p", "/api/*", true)], &LIMIT, None);
        assert_ne!(shared, key("d", &[("p", "/api/*")]));
        assert_ne!(shared, key("d", &[("p", "=/api/*")]));
    }

    #[test]
    fn identity_keeps_counters_across_a_new_number_but_not_a_new_window_or_override() {
        let more = Limit {
            requests: 99,
            ..LIMIT
        };
        let hourly = Limit {
            window_us: 3600 * US_PER_SECOND,
            ..LIMIT
        };
        let e = [("k", "v")];
        let base = counter_key("d", e, &LIMIT, None);
        assert_eq!(base, counter_key("d", e, &more, None));
        assert_ne!(base, counter_key("d", e, &hourly, None));
        assert_ne!(
            counter_key("d", e, &LIMIT, Some(10)),
            counter_key("d", e, &LIMIT, Some(20))
        );
        assert_ne!(base, counter_key("d", e, &LIMIT, Some(10)));
    }
}
