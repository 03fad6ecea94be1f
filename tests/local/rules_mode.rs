//! The rules commands decide as the deployment does: `test`, `diff` and `explain` take the
//! settings that change a decision from the same flags and variables as `serve` (the default
//! algorithm, the Go drop-in mode, stop-charging, shadow mode) and say which they decided with.

use crate::common::cli::{dir_with, portcullis, portcullis_with_env, s};

/// A 10/minute rule that names no algorithm.
const RULES: &str = "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 10}\n";

/// Ten hits at 59 s, and the eleventh at 61 s refused: true of a sliding window only (a fixed
/// window opens anew at 60 s).
const TEST: &str = "domain: d\ncases:\n  - name: ten a minute, over any minute\n    descriptor: [user=a]\n    steps:\n      - {at: 59s, repeat: 10, expect: ok}\n      - {at: 61s, expect: over_limit}\n";

#[test]
fn a_rules_test_decides_with_the_deployments_default_algorithm() {
    let rules = dir_with(&[("r.yaml", RULES)]);
    let tests = dir_with(&[("t.yaml", TEST)]);
    let args = ["test", s(rules.path()), s(tests.path())];
    let (code, out) = portcullis(&args);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("--default-algorithm sliding-window"), "{out}");

    // The deployment counts fixed windows: 20 pass around the minute, and the test says so.
    let (code, out) =
        portcullis_with_env(&args, &[("PORTCULLIS_DEFAULT_ALGORITHM", "fixed-window")]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("--default-algorithm fixed-window"), "{out}");
    let (code, out) = portcullis(&[&args[..], &["--default-algorithm", "fixed-window"]].concat());
    assert_eq!(code, 1, "{out}");
    // The Go drop-in mode counts fixed windows, and every hit.
    let (code, out) = portcullis(&[&args[..], &["--env-compat", "go"]].concat());
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("Go counting (every hit recorded) on"), "{out}");
    // The flag wins over the variable, as for `serve`.
    let (code, out) = portcullis_with_env(
        &[&args[..], &["--default-algorithm", "sliding-window"]].concat(),
        &[("PORTCULLIS_DEFAULT_ALGORITHM", "fixed-window")],
    );
    assert_eq!(code, 0, "{out}");
}

#[test]
fn every_rules_command_says_what_it_decides_with() {
    let rules = dir_with(&[("r.yaml", RULES)]);
    // Global shadow mode: the descriptor still answers over_limit (Envoy lets the call pass on
    // the overall code), and the run says it decided in shadow mode.
    let twelve = "domain: d\ncases:\n  - name: ten of twelve\n    descriptor: [user=a]\n    steps:\n      - {repeat: 12, allowed: 10}\n";
    let tests = dir_with(&[("t.yaml", twelve)]);
    let args = ["test", s(rules.path()), s(tests.path())];
    let (code, out) = portcullis_with_env(&args, &[("PORTCULLIS_SHADOW_MODE", "true")]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("--shadow-mode on"), "{out}");
    let (code, out) = portcullis(&[
        "explain",
        "--config",
        s(rules.path()),
        "--domain",
        "d",
        "user=a",
        "--stop-charging-when-over",
    ]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("--stop-charging-when-over on"), "{out}");
    let (code, out) = portcullis(&[
        "diff",
        s(rules.path()),
        s(rules.path()),
        "--env-compat",
        "go",
    ]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("--default-algorithm fixed-window"), "{out}");
}
