//! `explain`: how each level matched, every layer of a layered rule, what the scaling file makes
//! of a limit.

use super::*;

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

/// A limit the request carries (Envoy's override, `--limit`): it replaces the rule the entries
/// meet, counts on a key of its own (its count in the key), in a fixed window unless
/// `--override-algorithm` says otherwise, and is named in the metrics by the keys only.
#[test]
fn explain_shows_a_limit_the_request_carries() {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/rules");
    let config = examples.to_str().unwrap();
    let args = [
        "explain",
        "--config",
        config,
        "--domain",
        "edge",
        "--limit",
        "3/minute",
        "api_key=abc",
        "path=/api/orders/42",
    ];
    let (code, out) = portcullis(&args);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains(
            "rule: edge.api_key.path_/api/orders/*: 20 per second, fixed_window (replaced by the request's limit)"
        ),
        "{out}"
    );
    assert!(
        out.contains("limit carried by the request: edge.api_key.path: 3 per minute, fixed_window"),
        "{out}"
    );
    assert!(
        out.contains("key {edge|api_key=abc|path=/api/orders/42}:fw:60000000us:o3"),
        "{out}"
    );
    assert!(
        out.contains("metrics: counted as \"edge.api_key.path\""),
        "{out}"
    );
    let mut sliding = args.to_vec();
    sliding.extend(["--override-algorithm", "sliding-window"]);
    let (_, out) = portcullis(&sliding);
    assert!(out.contains("3 per minute, sliding_window"), "{out}");
    let (code, out) = portcullis(&[
        "explain",
        "--config",
        config,
        "--domain",
        "edge",
        "--limit",
        "3/fortnight",
        "k=v",
    ]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("is not a limit like 5/minute"), "{out}");
}
