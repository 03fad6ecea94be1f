//! `check`: the examples pass, every broken rule named with its file, line and field, every
//! problem of every file, `serve` refusing broken rules, warnings for rules that cannot do what
//! they say, the documented rules clean.

use super::*;

#[test]
fn check_accepts_the_examples() {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/rules");
    let (code, out) = portcullis(&["check", examples.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("OK"), "{out}");
}

#[test]
fn check_names_file_line_and_field_of_every_broken_rule() {
    // (file text, line, field, words of the message)
    let cases: &[(&str, u64, &str, &str)] = &[
        (
            "domain: a\ndescriptors:\n  - key: k\n     value: x\n",
            4,
            "yaml",
            "mapping values are not allowed",
        ),
        (
            "domain: a\ndescriptors:\n  - key: k\n    bogus: 1\n",
            4,
            "yaml",
            "unknown field `bogus`",
        ),
        (
            "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1, colour: red}\n",
            4,
            "yaml",
            "unknown field `colour`",
        ),
        ("domain: a\ndomain: b\n", 2, "yaml", "duplicate mapping key"),
        ("domain: \"\"\n", 1, "domain", "must not be empty"),
        ("descriptors: []\n", 1, "domain", "is required"),
        (
            "domain: a\ndescriptors:\n  - value: v\n",
            3,
            "descriptors[0].key",
            "must not be empty",
        ),
        (
            "domain: a\ndescriptors:\n  - key: \"\"\n",
            3,
            "descriptors[0].key",
            "must not be empty",
        ),
        (
            "domain: a\ndescriptors:\n  - key: k\n    value: v\n  - key: k\n    value: v\n",
            5,
            "descriptors[1].key",
            "already defined at line 3",
        ),
        (
            "domain: a\ndescriptors:\n  - key: k\n    descriptors:\n      - key: n\n      - key: n\n",
            6,
            "descriptors[0].descriptors[1].key",
            "already defined at line 5",
        ),
        (
            "domain: a\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 1\n",
            5,
            "descriptors[0].rate_limit.unit",
            "\"fortnight\" is not one of",
        ),
        (
            "domain: a\ndescriptors:\n  - key: k\n    rate_limit:\n      requests_per_unit: 1\n",
            5,
            "descriptors[0].rate_limit.unit",
            "is required",
        ),
        (
            "domain: a\ndescriptors:\n  - key: k\n    rate_limit:\n      unlimited: true\n      unit: second\n",
            6,
            "descriptors[0].rate_limit.unit",
            "must not be set when unlimited",
        ),
        (
            "domain: a\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      replaces:\n        - {}\n",
            8,
            "descriptors[0].rate_limit.replaces[0].name",
            "is required",
        ),
        (
            "domain: a\ndescriptors:\n  - key: k\n    rate_limit:\n      name: me\n      unit: second\n      requests_per_unit: 1\n      replaces:\n        - name: me\n",
            9,
            "descriptors[0].rate_limit.replaces[0].name",
            "cannot replace itself",
        ),
        (
            "domain: a\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      burst: 5\n",
            7,
            "descriptors[0].rate_limit.burst",
            "only applies to algorithm token_bucket",
        ),
        (
            "domain: a\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      algorithm: token_bucket\n      burst: 0\n",
            8,
            "descriptors[0].rate_limit.burst",
            "must be at least 1",
        ),
        (
            "domain: a\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      algorithm: leaky_bucket\n",
            7,
            "descriptors[0].rate_limit.algorithm",
            "is not one of",
        ),
        (
            "domain: a\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 5000000000\n",
            6,
            "descriptors[0].rate_limit.requests_per_unit",
            "above the most",
        ),
        (
            "domain: a\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      max_duration: 5m\n",
            7,
            "descriptors[0].rate_limit.max_duration",
            "only applies to algorithm concurrency",
        ),
        (
            "domain: a\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: hour\n      requests_per_unit: 2\n      algorithm: concurrency\n      max_duration: 2d\n",
            8,
            "descriptors[0].rate_limit.max_duration",
            "is not between 1s and 1d",
        ),
        (
            "domain: a\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: week\n      requests_per_unit: 2\n      algorithm: concurrency\n",
            5,
            "descriptors[0].rate_limit.unit",
            "at most a day",
        ),
        (
            "domain: a\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: minute\n      requests_per_unit: 1001\n      algorithm: concurrency\n",
            5,
            "descriptors[0].rate_limit.requests_per_unit",
            "more than the 1000 slots",
        ),
    ];
    for (text, line, field, words) in cases {
        let dir = dir_with(&[("rules.yaml", text)]);
        let (code, out) = portcullis(&["check", dir.path().to_str().unwrap()]);
        assert_eq!(code, 1, "{text}\n{out}");
        let expected = format!("rules.yaml:{line}: {field}: ");
        assert!(
            out.contains(&expected),
            "expected {expected:?} in:\n{out}\nfor:\n{text}"
        );
        assert!(out.contains(words), "expected {words:?} in:\n{out}");
    }
}

#[test]
fn check_lists_every_problem_of_every_file_including_a_domain_defined_twice() {
    let dir = dir_with(&[
        ("a.yaml", "domain: shared\n"),
        ("b.yaml", "domain: shared\n"),
        (
            "c.yaml",
            "domain: c\ndescriptors:\n  - key: \"\"\n  - key: k\n    rate_limit: {unit: eon}\n",
        ),
        // Dot entries are Kubernetes' ConfigMap machinery, never rules.
        (".hidden.yaml", "this is not yaml: [\n"),
    ]);
    let (code, out) = portcullis(&["check", dir.path().to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(
        out.contains("b.yaml:1: domain: domain \"shared\" is already defined in"),
        "{out}"
    );
    assert!(out.contains("c.yaml:3: descriptors[0].key"), "{out}");
    assert!(
        out.contains("c.yaml:5: descriptors[1].rate_limit.unit"),
        "{out}"
    );
    assert!(!out.contains(".hidden"), "{out}");
}

#[test]
fn serve_refuses_to_start_on_broken_rules_and_says_why() {
    let dir = dir_with(&[(
        "r.yaml",
        "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: eon}\n",
    )]);
    let (code, out) = portcullis(&[
        "serve",
        "--config",
        dir.path().to_str().unwrap(),
        "--grpc-addr",
        "127.0.0.1:0",
        "--admin-addr",
        "127.0.0.1:0",
    ]);
    assert_eq!(code, 1);
    assert!(
        out.contains("r.yaml:4: descriptors[0].rate_limit.unit"),
        "{out}"
    );
}

#[test]
fn check_warns_about_rules_that_load_but_cannot_do_what_they_say() {
    let dir = dir_with(&[(
        "traps.yaml",
        r#"domain: traps
descriptors:
  - key: path
    value: /api/*
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: path
    value: /api/v1/*
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: user
    rate_limit: {name: per-user, unit: minute, requests_per_unit: 5}
  - key: trial
    shadow_mode: true
    rate_limit:
      unit: minute
      requests_per_unit: 100
      replaces:
        - name: per-user
"#,
    )]);
    let (code, out) = portcullis(&["check", dir.path().to_str().unwrap()]);
    assert_eq!(code, 0, "warnings do not refuse: {out}");
    assert!(
        out.contains("warning: ") && out.contains("\"/api/v1/*\" is never matched"),
        "{out}"
    );
    assert!(out.contains("traps.yaml:6"), "{out}");
    assert!(
        out.contains("traps.trial is in shadow mode but replaces \"per-user\""),
        "{out}"
    );
}

/// Every rules file the documentation shows (a ```yaml block that starts with `domain:`) passes
/// `check` with no warning: a user copying one starts from something that works as written.
#[test]
fn the_documented_rules_check_clean() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut checked = 0;
    for doc in [
        "docs/rules.md",
        "README.md",
        "docs/envoy.md",
        "docs/coming-from-go.md",
    ] {
        let text = std::fs::read_to_string(root.join(doc)).expect(doc);
        for (i, block) in text.split("```yaml\n").skip(1).enumerate() {
            let block = block.split("```").next().unwrap_or_default();
            if !block.trim_start().starts_with("domain:") {
                continue;
            }
            let dir = dir_with(&[("r.yaml", block)]);
            let (code, out) = portcullis(&["check", dir.path().to_str().unwrap()]);
            assert_eq!(code, 0, "{doc}, yaml block {i}:\n{block}\n{out}");
            assert!(
                !out.contains("warning"),
                "{doc}, yaml block {i}:\n{block}\n{out}"
            );
            checked += 1;
        }
    }
    assert!(checked >= 3, "only {checked} documented rules files found");
}
