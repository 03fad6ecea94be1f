//! Runtime scaling: multipliers on limits, globally, per domain and per rule (or layer) name,
//! changed without editing rules. Two sources multiply: the scaling file (watched like the rules,
//! ConfigMap-friendly) and temporary factors with an expiry, set through the admin endpoint and
//! kept in the store (Redis, so every replica applies the same ones).
//!
//! Scaling changes the effective limit of a check, never the identity of its counter (the key
//! leaves the count out). It must never make a limit of one or more hits zero (that would refuse
//! everything), and never accept a factor that is not a finite number in (0, 1000].

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use crate::algorithm::Limit;

/// The largest factor accepted: scaling is for incidents and rollouts, not for typos of 10^6.
pub const MAX_FACTOR: f64 = 1000.0;

/// What a factor applies to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Scope {
    Global,
    Domain(String),
    /// A rule's `name`, or a layer's.
    Name(String),
}

impl Scope {
    /// The field the store keeps it under: `global`, `domain:<name>`, `name:<name>`.
    pub fn field(&self) -> String {
        match self {
            Scope::Global => "global".into(),
            Scope::Domain(d) => format!("domain:{d}"),
            Scope::Name(n) => format!("name:{n}"),
        }
    }

    pub fn from_field(field: &str) -> Option<Scope> {
        match field.split_once(':') {
            None if field == "global" => Some(Scope::Global),
            Some(("domain", d)) if !d.is_empty() => Some(Scope::Domain(d.into())),
            Some(("name", n)) if !n.is_empty() => Some(Scope::Name(n.into())),
            _ => None,
        }
    }

    /// From the admin endpoint's `scope` and `name`.
    pub fn parse(scope: &str, name: Option<&str>) -> Result<Scope, String> {
        let name = name.filter(|n| !n.is_empty());
        if let Some(n) = name
            && n.len() > MAX_SCOPE_NAME
        {
            return Err(format!(
                "a scaling name is at most {MAX_SCOPE_NAME} bytes (a domain or rule name)"
            ));
        }
        match (scope, name) {
            ("global", None) => Ok(Scope::Global),
            ("global", Some(_)) => Err("scope global takes no name".into()),
            ("domain", Some(n)) => Ok(Scope::Domain(n.into())),
            ("name", Some(n)) => Ok(Scope::Name(n.into())),
            ("domain" | "name", None) => Err(format!("scope {scope} needs a name")),
            (other, _) => Err(format!(
                "scope {other:?} is not one of global, domain, name"
            )),
        }
    }
}

impl std::fmt::Display for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Scope::Global => f.write_str("global"),
            Scope::Domain(d) => write!(f, "domain {d:?}"),
            Scope::Name(n) => write!(f, "name {n:?}"),
        }
    }
}

/// The longest domain or rule name a temporary factor may name (each is a field in the store).
pub const MAX_SCOPE_NAME: usize = 256;

/// Whether `factor` may be used, and why not.
pub fn check_factor(factor: f64) -> Result<f64, String> {
    if factor.is_finite() && factor > 0.0 && factor <= MAX_FACTOR {
        Ok(factor)
    } else {
        Err(format!(
            "factor {factor} is not a number above 0 and at most {MAX_FACTOR}"
        ))
    }
}

/// A temporary factor, as the store holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct Temporary {
    pub scope: Scope,
    pub factor: f64,
    /// Unix milliseconds on the store's clock.
    pub expires_at_ms: u64,
}

/// Every factor in force: the file's, and the temporary ones not yet expired.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Scaling {
    /// From the scaling file (empty without one).
    pub file: BTreeMap<Scope, f64>,
    pub temporary: Vec<Temporary>,
    /// The store's clock when the temporary factors were read (0: never), for "N s left".
    pub read_at_ms: u64,
}

impl Scaling {
    pub fn is_neutral(&self) -> bool {
        self.file.values().all(|f| *f == 1.0) && self.temporary.iter().all(|t| t.factor == 1.0)
    }

    /// The product of every factor whose scope is in `scopes`.
    fn product<'a>(&self, scopes: impl Iterator<Item = &'a Scope> + Clone) -> f64 {
        let file: f64 = scopes.clone().filter_map(|s| self.file.get(s)).product();
        let temporary: f64 = self
            .temporary
            .iter()
            .filter(|t| scopes.clone().any(|s| *s == t.scope))
            .map(|t| t.factor)
            .product();
        file * temporary
    }

    /// The factor for a limit of `domain` known by `name` (if any): global × domain × name, each
    /// the file's times the temporary one's.
    pub fn factor(&self, domain: &str, name: Option<&str>) -> f64 {
        if self.is_neutral() {
            return 1.0;
        }
        let mut scopes = vec![Scope::Global, Scope::Domain(domain.to_owned())];
        if let Some(name) = name {
            scopes.push(Scope::Name(name.to_owned()));
        }
        self.product(scopes.iter())
    }

    /// The factor a whole domain runs at (global × domain), for the per-domain metric.
    pub fn domain_factor(&self, domain: &str) -> f64 {
        self.factor(domain, None)
    }

    /// One line per factor, for `/rlconfig` and the admin endpoint.
    pub fn describe(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .file
            .iter()
            .map(|(scope, f)| format!("scaling: {scope} ×{f} (scaling file)"))
            .collect();
        for t in &self.temporary {
            let left_s = t
                .expires_at_ms
                .saturating_sub(self.read_at_ms)
                .div_ceil(1000);
            out.push(format!(
                "scaling: {} ×{} (temporary, {left_s} s left when last read; expires at {} ms of the store's clock)",
                t.scope, t.factor, t.expires_at_ms
            ));
        }
        out
    }

    /// The temporary factors of `entries` (field, factor, expiry) not expired at `now_ms`; fields
    /// it cannot read are skipped.
    pub fn temporary_from(entries: &[(String, f64, u64)], now_ms: u64) -> Vec<Temporary> {
        let mut out: Vec<Temporary> = entries
            .iter()
            .filter(|(_, factor, expires)| *expires > now_ms && check_factor(*factor).is_ok())
            .filter_map(|(field, factor, expires)| {
                Some(Temporary {
                    scope: Scope::from_field(field)?,
                    factor: *factor,
                    expires_at_ms: *expires,
                })
            })
            .collect();
        out.sort_by(|a, b| a.scope.cmp(&b.scope));
        out
    }
}

/// `limit` under `factor`: the count (and a bucket's burst) multiplied and rounded down, never
/// below one where it was one or more, never above what Envoy can carry.
pub fn scale(limit: &Limit, factor: f64) -> Limit {
    if factor == 1.0 {
        return *limit;
    }
    let times = |n: u64| -> u64 {
        if n == 0 {
            return 0;
        }
        let scaled = (n as f64 * factor).floor();
        (scaled as u64).clamp(1, u64::from(u32::MAX))
    };
    Limit {
        requests: times(limit.requests),
        burst: times(limit.burst),
        ..*limit
    }
}

/// The scaling file:
///
/// ```yaml
/// global: 1.0
/// domains: {edge: 0.5}
/// names: {login: 2}
/// ```
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileYaml {
    global: Option<f64>,
    #[serde(default)]
    domains: BTreeMap<String, f64>,
    #[serde(default)]
    names: BTreeMap<String, f64>,
}

/// Parses the scaling file's text; every problem is listed.
pub fn parse_file(path: &Path, text: &str) -> Result<BTreeMap<Scope, f64>, String> {
    let parsed: FileYaml = if text.trim().is_empty() {
        FileYaml {
            global: None,
            domains: BTreeMap::new(),
            names: BTreeMap::new(),
        }
    } else {
        serde_saphyr::from_str(text).map_err(|e| format!("{}: {e}", path.display()))?
    };
    let mut out = BTreeMap::new();
    let mut errors = Vec::new();
    let mut put = |scope: Scope, factor: f64| match check_factor(factor) {
        Ok(f) => {
            out.insert(scope, f);
        }
        Err(e) => errors.push(format!("{}: {scope}: {e}", path.display())),
    };
    if let Some(g) = parsed.global {
        put(Scope::Global, g);
    }
    for (d, f) in parsed.domains {
        put(Scope::Domain(d), f);
    }
    for (n, f) in parsed.names {
        put(Scope::Name(n), f);
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(errors.join("\n"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Algorithm;

    fn limit(requests: u64, burst: u64) -> Limit {
        Limit {
            algorithm: Algorithm::TokenBucket,
            requests,
            window_us: 1_000_000,
            burst,
        }
    }

    #[test]
    fn factors_multiply_across_scopes_and_sources() {
        let mut s = Scaling::default();
        assert_eq!(s.factor("edge", Some("login")), 1.0);
        s.file.insert(Scope::Global, 0.8);
        s.file.insert(Scope::Domain("edge".into()), 0.5);
        s.temporary.push(Temporary {
            scope: Scope::Name("login".into()),
            factor: 0.5,
            expires_at_ms: 10,
        });
        assert_eq!(s.factor("edge", Some("login")), 0.8 * 0.5 * 0.5);
        assert_eq!(s.factor("edge", None), 0.8 * 0.5);
        assert_eq!(s.factor("other", Some("login")), 0.8 * 0.5);
        assert_eq!(s.domain_factor("other"), 0.8);
    }

    #[test]
    fn scaling_rounds_down_but_never_to_zero() {
        assert_eq!(scale(&limit(10, 20), 0.5), limit(5, 10));
        assert_eq!(scale(&limit(3, 3), 0.5), limit(1, 1));
        assert_eq!(scale(&limit(1, 1), 0.01), limit(1, 1));
        assert_eq!(scale(&limit(0, 0), 2.0), limit(0, 0));
        assert_eq!(
            scale(&limit(u64::from(u32::MAX), 1), 1000.0),
            limit(u64::from(u32::MAX), 1000)
        );
    }

    #[test]
    fn expired_or_unreadable_temporary_factors_are_dropped() {
        let entries = vec![
            ("domain:edge".to_owned(), 0.5, 2_000),
            ("global".to_owned(), 0.1, 1_000),
            ("bogus".to_owned(), 0.5, 9_000),
            ("name:x".to_owned(), f64::NAN, 9_000),
        ];
        let t = Scaling::temporary_from(&entries, 1_500);
        assert_eq!(
            t,
            vec![Temporary {
                scope: Scope::Domain("edge".into()),
                factor: 0.5,
                expires_at_ms: 2_000
            }]
        );
    }

    #[test]
    fn the_file_is_validated() {
        let p = Path::new("s.yaml");
        let ok = parse_file(p, "global: 0.9\ndomains: {edge: 0.5}\nnames: {login: 2}\n").unwrap();
        assert_eq!(ok.get(&Scope::Domain("edge".into())), Some(&0.5));
        assert_eq!(ok.len(), 3);
        assert!(parse_file(p, "").unwrap().is_empty());
        let bad = parse_file(p, "global: 0\ndomains: {edge: 5000}\n").unwrap_err();
        assert!(bad.contains("global: factor 0"), "{bad}");
        assert!(bad.contains("domain \"edge\": factor 5000"), "{bad}");
        assert!(parse_file(p, "globl: 1\n").is_err());
        assert_eq!(
            Scope::parse("domain", Some("edge")),
            Ok(Scope::Domain("edge".into()))
        );
        assert!(Scope::parse("domain", None).is_err());
        assert!(Scope::parse("everything", None).is_err());
        assert_eq!(
            Scope::from_field(&Scope::Name("a:b".into()).field()),
            Some(Scope::Name("a:b".into()))
        );
    }
}
