//! `portcullis test` and `portcullis diff` as a platform team runs them in CI on its rules
//! repository: passing suites, a broken rule caught with both file:lines, unusable test files
//! refused with theirs, JUnit read back, every kind of change a diff reports, and the exit codes
//! a pipeline branches on.

mod common;

use common::cli::{dir_with, portcullis, s};

use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The line of `needle` in `text`, 1-based.
fn line_of(text: &str, needle: &str) -> usize {
    text.lines()
        .position(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("{needle:?} not in the text"))
        + 1
}

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
fn halved_examples() -> tempfile::TempDir {
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

/// README's "Testing your rules": its test file is examples/tests/login.yaml, and its diff is what
/// `portcullis diff` prints for that pull request (logins taken to 3 a minute).
#[test]
fn the_readme_test_file_and_diff_are_real() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let section = &readme[readme.find("## Testing your rules").expect("the section")..];
    let block = |start: &str| {
        let at = section.find(start).expect("the block") + start.len();
        section[at..section[at..].find("```").unwrap() + at].to_owned()
    };
    let test_file = block("```yaml\n");
    assert_eq!(
        test_file,
        std::fs::read_to_string(root().join("examples/tests/login.yaml")).unwrap()
    );
    let printed = block("$ portcullis diff main/rules rules --tests tests\n");

    let work = tempfile::tempdir().unwrap();
    for dir in ["main/rules", "rules", "tests"] {
        std::fs::create_dir_all(work.path().join(dir)).unwrap();
    }
    for entry in std::fs::read_dir(root().join("examples/rules")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(work.path().join("main/rules").join(name), &text).unwrap();
        let changed = if name == "edge.yaml" {
            text.replace("requests_per_unit: 5\n", "requests_per_unit: 3\n")
        } else {
            text
        };
        std::fs::write(work.path().join("rules").join(name), changed).unwrap();
    }
    std::fs::write(work.path().join("tests/login.yaml"), &test_file).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_portcullis"))
        .args(["diff", "main/rules", "rules", "--tests", "tests"])
        .current_dir(work.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(String::from_utf8_lossy(&out.stdout), printed);
}

/// Every test file shown in README and docs/ (a YAML block with `cases:`) is one
/// `portcullis test` accepts.
#[test]
fn the_documented_test_files_parse() {
    let text = common::docs();
    let blocks: Vec<&str> = text
        .split("```yaml\n")
        .skip(1)
        .filter_map(|rest| rest.split_once("```").map(|(block, _)| block))
        .filter(|block| block.contains("\ncases:"))
        .collect();
    assert!(blocks.len() >= 2, "README's and docs/rules-testing.md's");
    for block in blocks {
        if let Err(errors) =
            portcullis::review::spec::parse(std::path::Path::new("doc.yaml"), block)
        {
            panic!("{errors:?}\n{block}");
        }
    }
}

/// The pre-commit hooks run our commands as pre-commit would: `entry` then the `args` a rules
/// repository gives (here the examples), without file names; a broken rules directory fails.
#[test]
fn the_pre_commit_hooks_run_check_and_test() {
    #[derive(serde::Deserialize)]
    struct Hook {
        id: String,
        entry: String,
        language: String,
        pass_filenames: bool,
    }
    let text = std::fs::read_to_string(root().join(".pre-commit-hooks.yaml")).unwrap();
    let hooks: Vec<Hook> = serde_saphyr::from_str(&text).expect("the hooks file");
    let ids: Vec<&str> = hooks.iter().map(|h| h.id.as_str()).collect();
    assert_eq!(ids, ["portcullis-check", "portcullis-test"]);
    let rules = root().join("examples/rules");
    let tests = root().join("examples/tests");
    let broken = dir_with(&[(
        "x.yaml",
        "domain: x\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
    )]);
    for hook in &hooks {
        assert_eq!(hook.language, "rust", "built from this repository");
        assert!(!hook.pass_filenames, "the commands take directories");
        let (program, subcommand) = hook.entry.split_once(' ').expect("program and subcommand");
        assert_eq!(program, "portcullis", "the binary cargo installs");
        let args: Vec<&str> = match subcommand {
            "check" => vec![s(&rules)],
            "test" => vec![s(&rules), s(&tests)],
            other => panic!("unexpected hook command {other}"),
        };
        let (code, out) = portcullis(&[&[subcommand], args.as_slice()].concat());
        assert_eq!(code, 0, "{}: {out}", hook.id);
        let mut failing = args.clone();
        failing[0] = s(broken.path());
        let (code, out) = portcullis(&[&[subcommand], failing.as_slice()].concat());
        assert_ne!(code, 0, "{}: {out}", hook.id);
        assert!(out.contains("x.yaml:4:"), "{}: {out}", hook.id);
    }
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
