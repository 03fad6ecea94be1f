//! The command line as a platform team uses it in CI: `portcullis check` on good and broken rule
//! directories, and `portcullis explain`.

mod common;

use common::cli::{dir_with, portcullis};

use std::path::Path;

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
fn explain_shows_how_each_level_matched() {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/rules");
    let config = examples.to_str().unwrap();
    let (code, out) = portcullis(&[
        "explain",
        "--config",
        config,
        "--domain",
        "edge",
        "api_key=abc",
        "path=/api/orders/42",
    ]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("level 1: api_key=\"abc\": default (no value), at"),
        "{out}"
    );
    assert!(
        out.contains("level 2: path=\"/api/orders/42\": wildcard \"/api/orders/*\""),
        "{out}"
    );
    assert!(
        out.contains("rule: edge.api_key.path_/api/orders/*: 20 per second, fixed_window"),
        "{out}"
    );

    let (_, out) = portcullis(&[
        "explain",
        "--config",
        config,
        "--domain",
        "edge",
        "path=/nowhere",
    ]);
    assert!(out.contains("no match at this level"), "{out}");
    assert!(
        out.contains("no rule: level 1 matches nothing the rules define there"),
        "{out}"
    );

    let (_, out) = portcullis(&["explain", "--config", config, "--domain", "nope", "k=v"]);
    assert!(out.contains("not configured"), "{out}");
}

#[test]
fn the_readme_rules_examples_load() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    for page in std::fs::read_dir(root.join("docs")).unwrap() {
        readme.push_str(&std::fs::read_to_string(page.unwrap().path()).unwrap());
    }
    // Every rules example (a YAML block that starts with `domain:`; not a rules test file, which
    // has `cases:`, checked in tests/rules_review.rs), each on its own.
    let blocks: Vec<&str> = readme
        .split("```yaml\n")
        .skip(1)
        .filter_map(|rest| rest.split_once("```").map(|(block, _)| block))
        .filter(|block| block.starts_with("domain:") && !block.contains("\ncases:"))
        .collect();
    assert!(blocks.len() >= 2, "the rules and the layered examples");
    for block in blocks {
        let dir = dir_with(&[("readme.yaml", block)]);
        let (code, out) = portcullis(&["check", dir.path().to_str().unwrap()]);
        assert_eq!(code, 0, "{out}\n{block}");
    }
}

#[test]
fn serve_refuses_settings_that_would_misbehave_naming_each_one() {
    let dir = dir_with(&[("r.yaml", "domain: a\n")]);
    let config = dir.path().to_str().unwrap();
    let base = [
        "serve",
        "--config",
        config,
        "--grpc-addr",
        "127.0.0.1:0",
        "--admin-addr",
        "127.0.0.1:0",
    ];
    // Each of these used to panic, stop a background task silently, or put every key in one slot.
    for (args, says) in [
        (&["--store-timeout", "0"][..], "--store-timeout"),
        (&["--store-timeout", "3600s"][..], "--store-timeout"),
        (&["--reload-interval", "0"][..], "--reload-interval"),
        (&["--near-limit-ratio", "NaN"][..], "--near-limit-ratio"),
        (&["--near-limit-ratio", "1.5"][..], "--near-limit-ratio"),
        (&["--key-prefix", "app{1}:"][..], "--key-prefix"),
        (&["--max-descriptors", "0"][..], "--max-descriptors"),
        (&["--max-entries", "0"][..], "--max-entries"),
        (&["--max-string-bytes", "0"][..], "--max-string-bytes"),
        (&["--max-message-bytes", "0"][..], "--max-message-bytes"),
        (&["--redis-pool-size", "0"][..], "--redis-pool-size"),
        (&["--drain-period", "86400s"][..], "--drain-period"),
        (
            &["--statsd-flush-interval", "0s"][..],
            "--statsd-flush-interval",
        ),
        (
            &["--traces-sampling-ratio", "2"][..],
            "--traces-sampling-ratio",
        ),
        (
            &["--rules-xds-backoff-random-factor", "1.5"][..],
            "--rules-xds-backoff-random-factor",
        ),
        (
            &["--rules-xds-backoff-max", "1ms"][..],
            "--rules-xds-backoff-max",
        ),
        (
            &["--grpc-max-connection-age", "0s"][..],
            "--grpc-max-connection-age",
        ),
        (
            &["--store-timeout", "50ms", "--grpc-request-timeout", "20ms"][..],
            "--grpc-request-timeout",
        ),
    ] {
        let mut all: Vec<&str> = base.to_vec();
        all.extend_from_slice(args);
        let (code, out) = portcullis(&all);
        assert_eq!(code, 1, "{args:?} must be refused: {out}");
        assert!(out.contains(says), "{args:?}: {out}");
        assert!(!out.contains("panicked"), "{args:?}: {out}");
    }
    // A scaling file that cannot apply stops the start-up too, naming the factor.
    let scaling = dir_with(&[("s.yaml", "domains: {a: 0}\n")]);
    let file = scaling.path().join("s.yaml");
    let mut all: Vec<&str> = base.to_vec();
    all.extend_from_slice(&["--scaling-file", file.to_str().unwrap()]);
    let (code, out) = portcullis(&all);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("--scaling-file") && out.contains("domain \"a\": factor 0"),
        "{out}"
    );
    // Several problems are all listed at once.
    let mut all: Vec<&str> = base.to_vec();
    all.extend_from_slice(&["--store-timeout", "0", "--key-prefix", "{x}"]);
    let (code, out) = portcullis(&all);
    assert_eq!(code, 1);
    assert!(
        out.contains("--store-timeout") && out.contains("--key-prefix"),
        "{out}"
    );
}

#[test]
fn a_domain_across_files_merges_only_when_asked_and_never_twice_the_same_key() {
    let dir = dir_with(&[
        (
            "a.yaml",
            "domain: shared\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 5}\n",
        ),
        (
            "b.yaml",
            "domain: shared\ndescriptors:\n  - key: path\n    rate_limit: {unit: minute, requests_per_unit: 7}\n",
        ),
    ]);
    let path = dir.path().to_str().unwrap();
    let (code, out) = portcullis(&["check", path]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("--merge-domain-config"), "{out}");
    let (code, out) = portcullis(&["check", "--merge-domain-config", path]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("1 domain(s), 2 rule(s)"), "{out}");
    let (_, out) = portcullis(&[
        "explain",
        "--merge-domain-config",
        "--config",
        path,
        "--domain",
        "shared",
        "path=/x",
    ]);
    assert!(out.contains("shared.path: 7 per minute"), "{out}");

    std::fs::write(
        dir.path().join("c.yaml"),
        "domain: shared\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 1}\n",
    )
    .unwrap();
    let (code, out) = portcullis(&["check", "--merge-domain-config", path]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("c.yaml:3") && out.contains("duplicate descriptor when merging"),
        "{out}"
    );
}

#[test]
fn every_go_field_loads_and_share_threshold_needs_a_wildcard() {
    let dir = dir_with(&[(
        "go.yaml",
        r#"domain: go
descriptors:
  - key: path
    value: /files/*
    share_threshold: true
    value_to_metric: true
    quota_mode: true
    detailed_metric: true
    shadow_mode: false
    metadata:
      team: storage
      limits: [1, 2]
    rate_limit:
      name: files
      unit: minute
      requests_per_unit: 10
      replaces:
        - name: other
"#,
    )]);
    let (code, out) = portcullis(&["check", dir.path().to_str().unwrap()]);
    assert_eq!(code, 0, "{out}");
    let dir = dir_with(&[(
        "bad.yaml",
        "domain: go\ndescriptors:\n  - key: path\n    value: /files\n    share_threshold: true\n    rate_limit: {unit: minute, requests_per_unit: 1}\n",
    )]);
    let (code, out) = portcullis(&["check", dir.path().to_str().unwrap()]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("bad.yaml:5: descriptors[0].share_threshold"),
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

#[test]
fn explain_and_check_show_every_layer_of_a_layered_rule() {
    let dir = dir_with(&[(
        "l.yaml",
        "domain: l\ndescriptors:\n  - key: user\n    rate_limits:\n      - {name: burst, unit: second, requests_per_unit: 10, algorithm: token_bucket, burst: 20}\n      - {name: hourly, unit: hour, requests_per_unit: 1000}\n",
    )]);
    let config = dir.path().to_str().unwrap();
    let (code, out) = portcullis(&["explain", "--config", config, "--domain", "l", "user=u"]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains(
            "rule: l.user: 10 per second, token_bucket, burst 20, name \"burst\" AND 1000 per hour, sliding_window, name \"hourly\""
        ),
        "{out}"
    );
    let (code, out) = portcullis(&["check", config]);
    assert_eq!(code, 0, "{out}");
    let broken = dir_with(&[(
        "l.yaml",
        "domain: l\ndescriptors:\n  - key: user\n    rate_limits:\n      - {unit: hour, requests_per_unit: 5}\n      - {unit: hour, requests_per_unit: 5, burst: 3}\n",
    )]);
    let (code, out) = portcullis(&["check", broken.path().to_str().unwrap()]);
    assert_ne!(code, 0);
    assert!(
        out.contains("descriptors[0].rate_limits[1].burst: only applies to algorithm token_bucket"),
        "{out}"
    );
}

#[test]
fn explain_shows_what_the_scaling_file_makes_of_a_limit() {
    let dir = dir_with(&[(
        "l.yaml",
        "domain: l\ndescriptors:\n  - key: user\n    rate_limit: {name: per-user, unit: hour, requests_per_unit: 100}\n",
    )]);
    let scaling = dir_with(&[("s.yaml", "domains: {l: 0.5}\nnames: {per-user: 0.5}\n")]);
    let file = scaling.path().join("s.yaml");
    let (code, out) = portcullis(&[
        "explain",
        "--config",
        dir.path().to_str().unwrap(),
        "--scaling-file",
        file.to_str().unwrap(),
        "--domain",
        "l",
        "user=u",
    ]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("scaling: ×0.25: 25 per hour"), "{out}");
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
