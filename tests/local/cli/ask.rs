//! `portcullis ask` as an operator uses it on a running replica: `--probe` looks without
//! spending, and an ask never keeps a concurrency slot.

use super::*;
use crate::common::process::ServeProcess;

const RULES: &str = "domain: d
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: job
    rate_limit: {algorithm: concurrency, requests_per_unit: 1, unit: hour}
";

/// `--hits 0` counted as 1 and there was no other way: every ask spent, and an ask on a
/// concurrency rule held its slot for the whole lease (an hour here: the second ask refused).
#[test]
fn ask_can_look_without_spending_and_never_holds_a_concurrency_slot() {
    let rules = dir_with(&[("r.yaml", RULES)]);
    let server = ServeProcess::spawn(rules.path(), &[], &[], &[]);
    let addr = format!("127.0.0.1:{}", server.grpc_port);
    let ask = |extra: &[&str], descriptor: &str| {
        let mut args = vec!["ask", "--addr", &addr, "--domain", "d", "-d", descriptor];
        args.extend_from_slice(extra);
        portcullis(&args)
    };
    // Probes spend nothing: the one request a minute is still there after three.
    for _ in 0..3 {
        let (code, out) = ask(&["--probe"], "user=a");
        assert_eq!(code, 0, "{out}");
        assert!(out.contains("remaining 1"), "{out}");
    }
    let (code, out) = ask(&[], "user=a");
    assert_eq!(code, 0, "{out}");
    let (code, out) = ask(&["--probe"], "user=a");
    assert!(
        out.contains("remaining 0"),
        "the ask spent it: {code} {out}"
    );
    let (code, out) = ask(&["--probe", "--hits", "3"], "user=a");
    assert_eq!(
        code, 2,
        "a probe spends nothing, so it takes no hits: {out}"
    );
    // Each ask takes the one slot and gives it back once answered: the next one passes too.
    for _ in 0..2 {
        let (code, out) = ask(&[], "job=j");
        assert_eq!(code, 0, "{out}");
        assert!(
            out.contains("released: 1 concurrency slot(s) of job"),
            "{out}"
        );
    }
    let (code, out) = ask(&["--probe"], "job=j");
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("remaining 1"), "no slot held: {out}");
    assert!(!out.contains("released"), "a probe takes none: {out}");
}

/// A plain descriptor before a concurrency one of the same keys: the service names the
/// concurrency one `user#2` and `ask` gives back `user#2`'s slot. Before one function named both,
/// the service said `user` and `ask` looked for `user#2`: the slot stayed held for its lease (an
/// hour), and the second ask was refused.
#[test]
fn ask_gives_back_a_slot_behind_a_plain_descriptor_of_the_same_keys() {
    const SAME_KEYS: &str = "domain: d
descriptors:
  - key: user
    value: plain
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: user
    rate_limit: {algorithm: concurrency, requests_per_unit: 1, unit: hour}
";
    let rules = dir_with(&[("r.yaml", SAME_KEYS)]);
    let server = ServeProcess::spawn(rules.path(), &[], &[], &[]);
    let addr = format!("127.0.0.1:{}", server.grpc_port);
    for _ in 0..2 {
        let (code, out) = portcullis(&[
            "ask",
            "--addr",
            &addr,
            "--domain",
            "d",
            "-d",
            "user=plain",
            "-d",
            "user=j",
        ]);
        assert_eq!(code, 0, "the slot was kept by the ask before: {out}");
        assert!(
            out.contains("released: 1 concurrency slot(s) of user#2"),
            "{out}"
        );
    }
}
