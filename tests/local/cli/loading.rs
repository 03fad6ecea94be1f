//! Loading rules and settings: README's examples, settings that would misbehave refused naming
//! each, a domain across files, every Go field.

use super::*;

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

/// A misspelled `PORTCULLIS_*` variable used to start a replica on the default it meant to change
/// (`PORTCULLIS_STOR=redis`: a memory store, every replica counting alone); a Redis URL without
/// a scheme said only "Redis URL did not parse". Kubernetes' service links of a Service named
/// `portcullis` are not refused.
#[test]
fn a_misspelled_variable_or_a_url_without_a_scheme_is_refused_naming_what_was_meant() {
    let dir = dir_with(&[("r.yaml", "domain: a\n")]);
    let config = dir.path().to_str().unwrap();
    let serve = [
        "serve",
        "--config",
        config,
        "--grpc-addr",
        "127.0.0.1:0",
        "--admin-addr",
        "127.0.0.1:0",
    ];
    let (code, out) = portcullis_with_env(
        &serve,
        &[
            ("PORTCULLIS_STOR", "redis"),
            ("PORTCULLIS_REDIS_ULR", "redis://127.0.0.1:1"),
        ],
    );
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains(
            "PORTCULLIS_STOR is not a Portcullis variable: did you mean PORTCULLIS_STORE?"
        ) && out.contains("did you mean PORTCULLIS_REDIS_URL?"),
        "{out}"
    );
    // The rules commands read the same variables, and refuse the same way.
    let (code, out) = portcullis_with_env(&["check", config], &[("PORTCULLIS_CONFG", config)]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("did you mean PORTCULLIS_CONFIG?"), "{out}");
    // As Kubernetes sets them for a Service named portcullis: not ours, not refused.
    let links = [
        ("PORTCULLIS_SERVICE_HOST", "10.0.0.11"),
        ("PORTCULLIS_SERVICE_PORT", "8081"),
        ("PORTCULLIS_PORT", "tcp://10.0.0.11:8081"),
        ("PORTCULLIS_PORT_8081_TCP_ADDR", "10.0.0.11"),
    ];
    let (code, out) = portcullis_with_env(&["check", config], &links);
    assert_eq!(code, 0, "{out}");
    // A URL without its scheme: the form it needs, from the variable that set it, the password
    // never printed.
    let (code, out) = portcullis_with_env(
        &serve,
        &[
            ("PORTCULLIS_STORE", "redis"),
            ("PORTCULLIS_REDIS_URL", "limiter:s3cret@127.0.0.1:6379"),
        ],
    );
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("PORTCULLIS_REDIS_URL has no scheme: write redis://HOST:PORT"),
        "{out}"
    );
    assert!(!out.contains("s3cret"), "{out}");
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
