//! Test files as a rules repository writes them: sequences through the serving code, a bad file
//! refused with its file and line, JUnit read back, a concurrency rule's holds and releases.

use super::*;

const API_RULES: &str = "\
domain: api
descriptors:
  - key: client_id
    rate_limits:
      - {name: burst, unit: second, requests_per_unit: 10, algorithm: token_bucket, burst: 20}
      - {name: hourly, unit: hour, requests_per_unit: 1000}
  - key: client_id
    value: vip
    rate_limit:
      name: vip
      unit: second
      requests_per_unit: 100
      replaces: [{name: login}]
  - key: path
    value: /login
    rate_limit: {name: login, unit: minute, requests_per_unit: 5}
  - key: tokens
    post_paid: true
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: day
    rate_limit: {unit: day, requests_per_unit: 3, algorithm: fixed_window}
";

const API_TESTS: &str = "\
domain: api
scaling: ../scaling.yaml
cases:
  - name: a client has a burst layer and an hourly layer, the hourly one scaled
    descriptor: [client_id=c1]
    expect:
      layers:
        - {name: burst, limit: 10/second, algorithm: token_bucket, burst: 20}
        - {name: hourly, limit: 50/hour, algorithm: sliding_window}
    steps:
      - {repeat: 25, allowed: 20}
      - {expect: over_limit, binding: burst}
      - {at: 2s, repeat: 20, allowed: 20}
      - {at: 4s, repeat: 20, allowed: 10}
      - {expect: over_limit, binding: hourly, limit: 50/hour}
  - name: a VIP call replaces the login limit
    descriptor: [path=/login]
    also: [[client_id=vip]]
    expect: {rule: login, replaced: true}
    steps:
      - {repeat: 10, expect: ok}
  - name: alone, a login is limited
    descriptor: [path=/login]
    expect: {rule: login, replaced: false, limit: 5/minute}
    steps:
      - {repeat: 6, allowed: 5}
  - name: post-paid tokens are recorded past the limit
    descriptor: [tokens=tenant-a]
    expect: {post_paid: true}
    steps:
      - {hits: 40, expect: ok}
      - {hits: 40, expect: ok}
      - {hits: 40}
      - {hits: 0, expect: over_limit}
      - {refund: 30}
      - {hits: 0, expect: ok}
  - name: a day's fixed window opens at midnight
    descriptor: [day=d]
    steps:
      - {repeat: 4, allowed: 3}
      - {at: 23h, expect: over_limit, reset: 3600s}
      - {after: 1h, expect: ok, remaining: 2}
";

#[test]
fn sequences_run_layers_replaces_post_paid_and_scaling_through_the_serving_code() {
    let dir = dir_with(&[
        ("rules/api.yaml", API_RULES),
        ("tests/api.yaml", API_TESTS),
        ("scaling.yaml", "names: {hourly: 0.05}\n"),
    ]);
    let (code, out) = portcullis(&[
        "test",
        s(&dir.path().join("rules")),
        s(&dir.path().join("tests")),
    ]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("5 case(s) in 1 file(s): 5 passed, 0 failed"),
        "{out}"
    );

    // Each expectation can fail: change one number at a time and the case fails at that line.
    for (from, to, says) in [
        (
            "{repeat: 25, allowed: 20}",
            "{repeat: 25, allowed: 21}",
            "expected 21 of 25 calls admitted, got 20",
        ),
        (
            "binding: hourly, limit: 50/hour",
            "binding: burst, limit: 50/hour",
            "expected the binding limit \"burst\"",
        ),
        (
            "limit: 50/hour, algorithm",
            "limit: 1000/hour, algorithm",
            "expected layer 2 as \"hourly\", 1000/hour",
        ),
        (
            "replaced: true",
            "replaced: false",
            "expected the rule in force",
        ),
        (
            "{hits: 0, expect: over_limit}",
            "{hits: 0, expect: ok}",
            "expected ok, got over_limit",
        ),
        ("reset: 3600s", "reset: 60s", "expected reset 60s"),
        ("remaining: 2}", "remaining: 3}", "expected remaining 3"),
    ] {
        assert!(API_TESTS.contains(from), "{from}");
        let changed = API_TESTS.replace(from, to);
        std::fs::write(dir.path().join("tests/api.yaml"), &changed).unwrap();
        let (code, out) = portcullis(&[
            "test",
            s(&dir.path().join("rules")),
            s(&dir.path().join("tests")),
        ]);
        assert_eq!(code, 1, "{to}: {out}");
        let line = line_of(&changed, to);
        let at = format!("api.yaml:{line}: FAIL");
        assert!(
            out.contains(&at) && out.contains(says),
            "{to}: wants {at} and {says:?}: {out}"
        );
    }
}

#[test]
fn a_bad_test_file_is_refused_with_its_file_and_line() {
    let rules = dir_with(&[("api.yaml", API_RULES)]);
    // (test file, line, words of the message)
    let cases: &[(&str, usize, &str)] = &[
        (
            "domain: api\ncases:\n  - name: a\n    descriptor: [k=v]\n    expct: {no_rule: true}\n",
            5,
            "expct",
        ),
        (
            "domain: api\ncases:\n  - name: a\n    descriptor: [k=v]\n    expect: {limit: 5/fortnight}\n",
            5,
            "5/minute",
        ),
        (
            "domain: api\ncases:\n  - name: a\n    descriptor: [k]\n    expect: {no_rule: true}\n",
            3,
            "key=value",
        ),
        (
            "domain: api\ncases:\n  - name: a\n    descriptor: [k=v]\n",
            3,
            "needs `expect`, `steps`",
        ),
        (
            "domain: api\ncases:\n  - name: a\n    descriptor: [k=v]\n    steps:\n      - {at: 5s}\n      - {at: 1s}\n",
            7,
            "only moves forward",
        ),
        (
            "domain: api\ncases:\n  - name: a\n    descriptor: [k=v]\n    steps:\n      - {expect: maybe}\n",
            6,
            "not ok or over_limit",
        ),
        (
            "domain: api\ncases:\n  - name: a\n    descriptor: [k=v]\n    expect: {no_rule: true}\n  - name: a\n    descriptor: [k=w]\n    expect: {no_rule: true}\n",
            6,
            "named at line 3",
        ),
        (
            "cases:\n  - name: a\n    descriptor: [k=v]\n    expect: {no_rule: true}\n",
            2,
            "no `domain`",
        ),
        (
            &format!(
                "domain: api\ncases:\n  - name: a\n    descriptor: [k=v]\n    steps:\n{}",
                "      - {repeat: 100000}\n".repeat(11)
            ),
            3,
            "more than the 1000000 a case may make",
        ),
        (
            "domain: api\nscaling: missing.yaml\ncases:\n  - name: a\n    descriptor: [k=v]\n    expect: {no_rule: true}\n",
            2,
            "missing.yaml",
        ),
    ];
    for (text, line, words) in cases {
        let tests = dir_with(&[("t.yaml", text)]);
        let file = tests.path().join("t.yaml");
        let (code, out) = portcullis(&["test", s(rules.path()), s(&file)]);
        assert_eq!(code, 2, "{text}: {out}");
        let at = format!("{}:{line}:", file.display());
        assert!(
            out.contains(&at) && out.contains(words),
            "{text}: wants {at} and {words:?}: {out}"
        );
    }
    // Rules that do not load, and a test path that holds no test file, are unusable too.
    let broken = dir_with(&[(
        "x.yaml",
        "domain: x\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
    )]);
    let (code, out) = portcullis(&["test", s(broken.path()), s(&root().join("examples/tests"))]);
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains("x.yaml:4: descriptors[0].rate_limit.unit"),
        "{out}"
    );
    let empty = tempfile::tempdir().unwrap();
    let (code, out) = portcullis(&["test", s(rules.path()), s(empty.path())]);
    assert_eq!(code, 2, "{out}");
}

#[test]
fn junit_output_reads_back_with_every_case_and_failure() {
    let halved = halved_examples();
    let junit = tempfile::tempdir().unwrap();
    let path = junit.path().join("results.xml");
    let (code, out) = portcullis(&[
        "test",
        s(halved.path()),
        s(&root().join("examples/tests")),
        "--junit",
        s(&path),
    ]);
    assert_eq!(code, 1, "{out}");
    let xml = std::fs::read_to_string(&path).unwrap();
    let doc = roxmltree::Document::parse(&xml).expect("well-formed JUnit XML");
    let suites = doc.root_element();
    assert_eq!(suites.tag_name().name(), "testsuites");
    assert_eq!(suites.attribute("tests"), Some("14"));
    assert_eq!(suites.attribute("failures"), Some("11"));
    let cases: Vec<_> = doc
        .descendants()
        .filter(|n| n.has_tag_name("testcase"))
        .collect();
    assert_eq!(cases.len(), 14);
    let login = cases
        .iter()
        .find(|c| c.attribute("name") == Some("logins have their own token bucket"))
        .expect("the login case");
    let failure = login
        .children()
        .find(|n| n.has_tag_name("failure"))
        .expect("a failure element");
    assert!(
        failure
            .attribute("message")
            .unwrap()
            .contains("expected limit 5/minute"),
        "{xml}"
    );
    let passing = cases
        .iter()
        .find(|c| c.attribute("name") == Some("health checks are never limited"))
        .unwrap();
    assert!(passing.children().all(|n| !n.has_tag_name("failure")));
}

/// A concurrency rule through `portcullis test`: steps that hold slots, are refused, release, and
/// find the slots of requests whose leases ended free again; `explain` says what it is.
#[test]
fn a_concurrency_rule_holds_and_releases_in_a_test_sequence() {
    const RULES: &str = "domain: llm
descriptors:
  - key: user
    rate_limit: {algorithm: concurrency, requests_per_unit: 2, unit: hour, max_duration: 5m}
";
    const TESTS: &str = "domain: llm
cases:
  - name: two in flight per user
    descriptor: [user=alice]
    expect: {limit: 2/hour, algorithm: concurrency}
    steps:
      - {at: 0s, repeat: 2, expect: ok}
      - {at: 1s, expect: over_limit, remaining: 0, reset: 299s}
      - {refund: 5}
      - {repeat: 2, expect: ok, remaining: 0}
      - {expect: over_limit}
      - {at: 302s, expect: ok, remaining: 1}
";
    let dir = dir_with(&[("rules/llm.yaml", RULES), ("tests/llm.yaml", TESTS)]);
    let run = |tests: &str| {
        std::fs::write(dir.path().join("tests/llm.yaml"), tests).unwrap();
        portcullis(&[
            "test",
            s(&dir.path().join("rules")),
            s(&dir.path().join("tests")),
        ])
    };
    let (code, out) = run(TESTS);
    assert_eq!(code, 0, "{out}");
    // A release of 5 with 2 held frees 2, not 5: a third call after it is refused.
    let (code, out) =
        run(&TESTS.replace("      - {expect: over_limit}\n", "      - {expect: ok}\n"));
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("expected ok, got over_limit"), "{out}");

    let (code, out) = portcullis(&[
        "explain",
        "--config",
        s(&dir.path().join("rules")),
        "--domain",
        "llm",
        "user=alice",
    ]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("2 per hour, concurrency, lease 300s"), "{out}");
}
