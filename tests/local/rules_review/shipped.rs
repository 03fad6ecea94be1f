//! The rules this repository ships against their tests: they pass, halving every limit fails
//! them and the diff says so, and `explain` agrees with `test` on every case.

use super::*;

#[test]
fn the_examples_and_the_deploy_rules_pass_their_tests() {
    for (rules, tests) in [
        ("examples/rules", "examples/tests"),
        (
            "deploy/kubernetes/base/rules",
            "deploy/kubernetes/base/rules-tests",
        ),
        ("deploy/istio/rules/rules", "deploy/istio/rules/tests"),
    ] {
        let (code, out) = portcullis(&["test", s(&root().join(rules)), s(&root().join(tests))]);
        assert_eq!(code, 0, "{rules}: {out}");
        assert!(out.contains(" 0 failed"), "{out}");
    }
}

/// A copy of examples/rules with every count (limits and bursts) halved.
pub fn halved_examples() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    for entry in std::fs::read_dir(root().join("examples/rules")).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        let halved: Vec<String> = text
            .lines()
            .map(|line| {
                for field in ["requests_per_unit: ", "burst: "] {
                    if let Some(at) = line.find(field) {
                        let (head, number) = line.split_at(at + field.len());
                        if let Ok(n) = number.trim().parse::<u64>() {
                            return format!("{head}{}", n / 2);
                        }
                    }
                }
                line.to_owned()
            })
            .collect();
        std::fs::write(
            dir.path().join(path.file_name().unwrap()),
            halved.join("\n"),
        )
        .unwrap();
    }
    dir
}

#[test]
fn halving_every_example_limit_fails_the_tests_and_the_diff_says_so() {
    let halved = halved_examples();
    let tests = root().join("examples/tests");
    let (code, out) = portcullis(&["test", s(halved.path()), s(&tests)]);
    assert_eq!(code, 1, "{out}");
    let edge_tests = std::fs::read_to_string(tests.join("edge.yaml")).unwrap();
    let case_line = line_of(&edge_tests, "name: logins have their own token bucket") + 2;
    let rules_line = line_of(
        &std::fs::read_to_string(halved.path().join("edge.yaml")).unwrap(),
        "name: login",
    );
    // One line per failing case: the test file:line, what was expected and what happened, and
    // the rule's file:line.
    let expected = format!(
        "examples/tests/edge.yaml:{case_line}: FAIL \"logins have their own token bucket\": expected limit 5/minute, got "
    );
    let line = out
        .lines()
        .find(|l| l.contains(&expected))
        .unwrap_or_else(|| panic!("{expected:?} in {out}"));
    assert!(line.contains("2 per minute"), "{line}");
    assert!(
        line.contains(&format!(
            "at {}:{rules_line}]",
            halved.path().join("edge.yaml").display()
        )),
        "{line}"
    );
    assert!(
        out.contains("14 case(s) in 3 file(s): 3 passed, 11 failed"),
        "{out}"
    );

    let (code, out) = portcullis(&[
        "diff",
        s(&root().join("examples/rules")),
        s(halved.path()),
        "--json",
    ]);
    assert_eq!(code, 1, "{out}");
    let doc: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    let changes = doc["rules"].as_array().unwrap();
    assert_eq!(
        changes.len(),
        6,
        "every limited rule of the examples: {doc:#}"
    );
    for change in changes {
        let limit = change["changes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["field"] == "limit")
            .unwrap_or_else(|| panic!("a limit change: {change:#}"));
        let factor = limit["factor"].as_f64().unwrap();
        assert!(factor <= 0.5, "{change:#}");
    }
    let (_, text) = portcullis(&[
        "diff",
        s(&root().join("examples/rules")),
        s(halved.path()),
        "--tests",
        s(&tests),
    ]);
    assert!(
        text.contains("changed edge.remote_address: 600/minute -> 300/minute, 0.5x (tighter)"),
        "{text}"
    );
    assert!(
        text.contains("changed login: 5/minute -> 2/minute, 0.4x (tighter)"),
        "{text}"
    );
    assert!(text.contains("changed login burst: 10 -> 5"), "{text}");
    assert!(
        text.contains("case \"logins have their own token bucket\": its rule edge.path_/api/login changes: 5 per minute, token_bucket, burst 10, name \"login\" -> 2 per minute"),
        "{text}"
    );
    assert!(
        text.contains("now fails: expected limit 5/minute"),
        "{text}"
    );
    assert!(
        text.contains("6 rule change(s), 11 test case(s) affected"),
        "{text}"
    );
}

/// `explain` and `test` answer by one code path: for every case of the shipped test files, the
/// rule `explain` prints is the rule the test run reports.
#[test]
fn explain_and_test_agree_on_every_shipped_case() {
    use portcullis::review::explain::Call;
    use portcullis::review::{commands, run::Bench, spec};
    use portcullis::rules::{LoadOptions, load_dir};
    let mut checked = 0;
    for (rules, tests) in [
        ("examples/rules", "examples/tests"),
        (
            "deploy/kubernetes/base/rules",
            "deploy/kubernetes/base/rules-tests",
        ),
        ("deploy/istio/rules/rules", "deploy/istio/rules/tests"),
    ] {
        let options = LoadOptions::default();
        let bench = Bench::new(std::sync::Arc::new(
            load_dir(&root().join(rules), options).expect("rules load"),
        ))
        .unwrap();
        for entry in std::fs::read_dir(root().join(tests)).unwrap() {
            let path = entry.unwrap().path();
            let file = spec::parse(&path, &std::fs::read_to_string(&path).unwrap()).unwrap();
            for case in &file.cases {
                let outcome = bench.run_case(case, &Default::default());
                let call = Call {
                    domain: case.domain.clone(),
                    descriptor: case.descriptor.clone(),
                    ..Call::default()
                };
                let mut out = Vec::new();
                let code = commands::explain(
                    &root().join(rules),
                    &call,
                    &options.into(),
                    None,
                    &mut out,
                    &mut std::io::sink(),
                );
                assert_eq!(code, 0);
                let explained = String::from_utf8(out).unwrap();
                match &outcome.rule {
                    Some(rule) => {
                        let key = rule.split(" at ").next().unwrap();
                        assert!(
                            explained.contains(&format!("rule: {key}: ")),
                            "{}: test met {rule}, explain says {explained}",
                            case.name
                        );
                    }
                    None => assert!(explained.contains("no rule"), "{}: {explained}", case.name),
                }
                checked += 1;
            }
        }
    }
    assert!(checked >= 20, "{checked} cases");
}
