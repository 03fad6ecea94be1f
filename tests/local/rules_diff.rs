//! `portcullis diff OLD NEW` as a reviewer reads it on a pull request: every kind of rule change
//! with both file:lines and limits as factors, the test cases a change affects, JSON for tools,
//! and the exit codes (0 nothing changes, 1 something does, 2 invalid input).

use crate::common::cli::{dir_with, portcullis, s};
use serde_json::Value;

const OLD: &str = "\
domain: shop
descriptors:
  - key: user
    rate_limit: {name: per-user, unit: minute, requests_per_unit: 60}
  - key: ip
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: bucket
    rate_limit: {unit: second, requests_per_unit: 10, algorithm: token_bucket, burst: 20}
  - key: client
    rate_limits:
      - {name: fast, unit: second, requests_per_unit: 10}
      - {name: slow, unit: hour, requests_per_unit: 1000}
  - key: trial
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: health
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: vip
    rate_limit: {unit: second, requests_per_unit: 100}
  - key: old
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: renamed
    rate_limit: {name: before, unit: second, requests_per_unit: 1}
  - key: same
    rate_limit: {unit: second, requests_per_unit: 1}
";

const NEW: &str = "\
domain: shop
descriptors:
  - key: user
    rate_limit: {name: per-user, unit: second, requests_per_unit: 2}
  - key: ip
    rate_limit: {unit: second, requests_per_unit: 10, algorithm: fixed_window}
  - key: bucket
    rate_limit: {unit: second, requests_per_unit: 10, algorithm: token_bucket, burst: 30}
  - key: client
    rate_limits:
      - {name: fast, unit: second, requests_per_unit: 5}
      - {name: slow, unit: hour, requests_per_unit: 1000}
      - {name: daily, unit: day, requests_per_unit: 5000}
  - key: trial
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: health
    rate_limit: {unlimited: true}
  - key: vip
    rate_limit: {unit: second, requests_per_unit: 100, replaces: [{name: per-user}]}
  - key: renamed
    rate_limit: {name: after, unit: second, requests_per_unit: 1}
  - key: same
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: fresh
    rate_limit: {unit: second, requests_per_unit: 1}
";

const TESTS: &str = "\
domain: shop
cases:
  - name: users get 60 a minute
    descriptor: [user=u]
    expect: {limit: 60/minute}
  - name: a trial is limited to 5 a minute
    descriptor: [trial=t]
    steps:
      - {repeat: 6, allowed: 5}
  - name: nothing limits fresh
    descriptor: [fresh=f]
    expect: {no_rule: true}
  - name: an unchanged rule
    descriptor: [same=s]
    steps:
      - {repeat: 2, allowed: 1}
";

/// The change of `field` on `rule`, from the JSON.
fn change<'a>(doc: &'a Value, rule: &str, field: &str) -> &'a Value {
    let entry = doc["rules"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["rule"] == rule)
        .unwrap_or_else(|| panic!("{rule} in {doc:#}"));
    entry["changes"]
        .as_array()
        .unwrap_or_else(|| panic!("changes of {rule}: {entry:#}"))
        .iter()
        .find(|c| c["field"] == field)
        .unwrap_or_else(|| panic!("{field} of {rule}: {entry:#}"))
}

#[test]
fn every_kind_of_change_is_reported_with_both_file_lines() {
    let old = dir_with(&[("shop.yaml", OLD)]);
    let new = dir_with(&[
        ("shop.yaml", NEW),
        (
            "other.yaml",
            "domain: other\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 7}\n",
        ),
    ]);
    let (code, out) = portcullis(&["diff", s(old.path()), s(new.path()), "--json"]);
    assert_eq!(code, 1, "{out}");
    let doc: Value = serde_json::from_str(&out).expect("JSON");

    let user = change(&doc, "shop.user", "limit");
    assert_eq!(
        (user["old"].as_str(), user["new"].as_str()),
        (Some("60/minute"), Some("2/second"))
    );
    assert_eq!(user["factor"].as_f64(), Some(2.0));
    let ip = change(&doc, "shop.ip", "algorithm");
    assert_eq!(
        (ip["old"].as_str(), ip["new"].as_str()),
        (Some("sliding_window"), Some("fixed_window"))
    );
    let burst = change(&doc, "shop.bucket", "burst");
    assert_eq!(
        (burst["old"].as_str(), burst["new"].as_str()),
        (Some("20"), Some("30"))
    );
    let fast = change(&doc, "shop.client", "layer \"fast\"");
    assert_eq!(fast["factor"].as_f64(), Some(0.5));
    let daily = change(&doc, "shop.client", "layer \"daily\"");
    assert_eq!(daily["old"].as_str(), Some("none"));
    assert!(daily["new"].as_str().unwrap().starts_with("5000 per day"));
    let shadow = change(&doc, "shop.trial", "shadow_mode");
    assert_eq!(
        (shadow["old"].as_str(), shadow["new"].as_str()),
        (Some("false"), Some("true"))
    );
    let health = change(&doc, "shop.health", "limit");
    assert_eq!(health["new"].as_str(), Some("unlimited"));
    assert!(health.get("factor").is_none());
    let vip = change(&doc, "shop.vip", "replaces");
    assert_eq!(vip["new"].as_str(), Some("[\"per-user\"]"));
    let renamed = change(&doc, "shop.renamed", "name");
    assert_eq!(
        (renamed["old"].as_str(), renamed["new"].as_str()),
        (Some("before"), Some("after"))
    );

    let rules = doc["rules"].as_array().unwrap();
    let kind_of = |rule: &str| {
        rules
            .iter()
            .find(|r| r["rule"] == rule)
            .map(|r| r["kind"].as_str().unwrap().to_owned())
    };
    assert_eq!(kind_of("shop.old").as_deref(), Some("removed"));
    assert_eq!(kind_of("shop.fresh").as_deref(), Some("added"));
    assert_eq!(kind_of("other.k").as_deref(), Some("added"));
    assert_eq!(
        kind_of("shop.same"),
        None,
        "an unchanged rule is not listed"
    );
    // Both places, each as file:line.
    let old_file = old.path().join("shop.yaml");
    let entry = rules.iter().find(|r| r["rule"] == "shop.user").unwrap();
    assert_eq!(
        entry["old_at"].as_str(),
        Some(format!("{}:4", old_file.display()).as_str())
    );
    assert_eq!(
        entry["new_at"].as_str(),
        Some(format!("{}:4", new.path().join("shop.yaml").display()).as_str())
    );
    let removed = rules.iter().find(|r| r["rule"] == "shop.old").unwrap();
    assert_eq!(
        removed["old_at"].as_str(),
        Some(format!("{}:20", old_file.display()).as_str())
    );

    // The text a reviewer reads.
    let (code, text) = portcullis(&["diff", s(old.path()), s(new.path())]);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("domain shop:"), "{text}");
    assert!(
        text.contains("changed per-user: 60/minute -> 2/second, 2x (looser)"),
        "{text}"
    );
    assert!(
        text.contains("removed shop.old: 1 per second, sliding_window"),
        "{text}"
    );
    assert!(
        text.contains("domain other:\n  added other.k: 7 per hour"),
        "{text}"
    );
}

#[test]
fn test_cases_show_which_descriptors_meet_another_rule_and_which_outcomes_change() {
    let old = dir_with(&[("shop.yaml", OLD)]);
    let new = dir_with(&[("shop.yaml", NEW)]);
    let tests = dir_with(&[("shop.yaml", TESTS)]);
    let (code, out) = portcullis(&["test", s(old.path()), s(tests.path())]);
    assert_eq!(code, 0, "the cases pass on the old rules: {out}");
    let (code, out) = portcullis(&[
        "diff",
        s(old.path()),
        s(new.path()),
        "--tests",
        s(tests.path()),
        "--json",
    ]);
    assert_eq!(code, 1, "{out}");
    let doc: Value = serde_json::from_str(&out).expect("JSON");
    let cases = doc["cases"].as_array().unwrap();
    let case = |name: &str| cases.iter().find(|c| c["case"] == name);
    let users = case("users get 60 a minute").expect("the user case");
    assert_eq!(users["passes_after"], false);
    assert!(
        users["failure_after"]
            .as_str()
            .unwrap()
            .contains("expected limit 60/minute")
    );
    let trial = case("a trial is limited to 5 a minute").expect("the trial case");
    assert_eq!(
        (
            trial["passes_before"].as_bool(),
            trial["passes_after"].as_bool()
        ),
        (Some(true), Some(false))
    );
    let fresh = case("nothing limits fresh").expect("the fresh case");
    assert!(fresh.get("rule_before").is_none());
    assert_eq!(fresh["rule_after"]["rule"], "shop.fresh");
    assert_eq!(
        fresh["rule_after"]["at"].as_str(),
        Some(format!("{}:26", new.path().join("shop.yaml").display()).as_str())
    );
    assert!(case("an unchanged rule").is_none(), "{doc:#}");
    let file = tests.path().join("shop.yaml");
    assert_eq!(
        users["at"].as_str(),
        Some(format!("{}:3", file.display()).as_str())
    );
}

#[test]
fn nothing_changed_exits_0_and_invalid_rules_exit_2() {
    let old = dir_with(&[("shop.yaml", OLD)]);
    let copy = dir_with(&[("renamed-file.yaml", OLD)]);
    let (code, out) = portcullis(&["diff", s(old.path()), s(copy.path())]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("0 rule change(s), 0 test case(s) affected"),
        "{out}"
    );
    let broken = dir_with(&[(
        "shop.yaml",
        "domain: shop\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
    )]);
    let (code, out) = portcullis(&["diff", s(old.path()), s(broken.path())]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("shop.yaml:4:"), "{out}");
    let bad_tests = dir_with(&[("t.yaml", "domain: shop\ncases: []\n")]);
    let (code, out) = portcullis(&[
        "diff",
        s(old.path()),
        s(old.path()),
        "--tests",
        s(bad_tests.path()),
    ]);
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains("t.yaml:1: `cases` must list at least one case"),
        "{out}"
    );
}
