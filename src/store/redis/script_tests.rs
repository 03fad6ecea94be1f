//! The script's reply parsed exactly, or refused as a protocol error, never a panic.

use super::*;
use redis::Value;

fn ints(numbers: &[i64]) -> Vec<Value> {
    numbers.iter().map(|&n| Value::Int(n)).collect()
}

fn array(parts: Vec<Vec<Value>>) -> Value {
    Value::Array(parts.into_iter().flatten().collect())
}

fn text(t: &str) -> Vec<Value> {
    vec![Value::BulkString(t.as_bytes().to_vec())]
}

#[test]
fn the_reply_splits_into_calls_keys_and_numbers() {
    // No clock; two calls: two keys (four numbers, six numbers), then one key.
    let reply = array(vec![
        ints(&[0, 2, 4, 1, 1_700_000_000_000_000, 3, 28_333_333_333]),
        ints(&[6, 0, (1 << 53) - 1, 0, 5, 2, 7]),
        ints(&[1, 4, 1, 2, 3, 4]),
    ]);
    assert_eq!(
        parse_reply(&reply).unwrap(),
        vec![
            vec![
                Ok(vec![1, 1_700_000_000_000_000, 3, 28_333_333_333]),
                Ok(vec![0, (1 << 53) - 1, 0, 5, 2, 7]),
            ],
            vec![Ok(vec![1, 2, 3, 4])],
        ]
    );
    assert_eq!(
        parse_reply(&array(vec![ints(&[0])])).unwrap(),
        Replies::new()
    );
    assert_eq!(
        parse_reply(&array(vec![ints(&[0, 0, 1, 2, 1, 2])])).unwrap(),
        vec![vec![], vec![Ok(vec![1, 2])]]
    );
}

#[test]
fn the_reply_tells_the_nodes_clock_even_when_every_call_expired() {
    let reply = array(vec![
        ints(&[1_700_000_000_123_456, 1]),
        text("EXPIRED portcullis: late"),
    ]);
    let (clock, calls) = parse_reply_with_clock(&reply).unwrap();
    assert_eq!(clock, Some(1_700_000_000_123_456));
    assert!(calls[0][0].is_err());
    let (clock, calls) = parse_reply_with_clock(&array(vec![ints(&[5])])).unwrap();
    assert_eq!((clock, calls), (Some(5), Replies::new()));
    // A fixed test clock: no TIME read, no clock told.
    let fixed = array(vec![ints(&[0, 1, 2, 1, 2])]);
    assert_eq!(parse_reply_with_clock(&fixed).unwrap().0, None);
}

#[test]
fn a_key_the_script_failed_fails_alone_with_what_redis_said() {
    let reply = array(vec![
        ints(&[0, 2, 4, 1, 2, 3, 4]),
        text("OOM command not allowed when used memory > 'maxmemory'."),
        ints(&[1, 4, 0, 5, 6, 7]),
    ]);
    let calls = parse_reply(&reply).unwrap();
    assert_eq!(calls[0][0], Ok(vec![1, 2, 3, 4]));
    assert!(matches!(&calls[0][1], Err(StoreError::Unavailable(m)) if m.contains("out of memory")));
    assert_eq!(calls[1][0], Ok(vec![0, 5, 6, 7]));
    let wrong = array(vec![
        ints(&[0, 1]),
        text("WRONGTYPE Operation against a key"),
    ]);
    let wrong = parse_reply(&wrong).unwrap();
    assert!(wrong[0][0].as_ref().is_err_and(StoreError::is_permanent));
}

#[test]
fn a_reply_that_is_not_numbers_is_a_protocol_error() {
    let broken = [
        // A negative number, a length past the end, a call cut short, a nil inside.
        array(vec![ints(&[0, 1, 2, 1, -2])]),
        array(vec![ints(&[0, 1, 5, 1, 2])]),
        array(vec![ints(&[0, 2, 1, 1])]),
        array(vec![ints(&[0, 1, 2, 1]), vec![Value::Nil]]),
        array(vec![ints(&[0, 1, -1])]),
        array(vec![]),
        Value::Nil,
        Value::Int(1),
        Value::BulkString(b"1 2 3 4".to_vec()),
    ];
    for value in broken {
        assert!(
            matches!(parse_reply(&value), Err(StoreError::Protocol(_))),
            "{value:?} parsed"
        );
    }
    // The end of the range parses.
    assert_eq!(
        parse_reply(&array(vec![ints(&[0, 1, 1, i64::MAX])])).unwrap(),
        vec![vec![Ok(vec![i64::MAX as u64])]]
    );
}

#[test]
fn any_values_parse_or_fail_without_panicking() {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};
    let mut runner = TestRunner::new(Config {
        cases: 2000,
        failure_persistence: None,
        rng_seed: proptest::test_runner::RngSeed::Fixed(0x5EED_0010),
        ..Config::default()
    });
    let values = proptest::collection::vec(
        prop_oneof![
            (-2i64..8).prop_map(Value::Int),
            any::<i64>().prop_map(Value::Int),
            Just(Value::Nil),
            Just(Value::BulkString(b"OOM full".to_vec())),
        ],
        0..64,
    );
    runner
        .run(&values, |values| {
            if let Ok(calls) = parse_reply(&Value::Array(values.clone())) {
                // What parses is exactly what was sent: writing it back gives the values.
                let mut back = vec![values[0].clone()];
                for keys in &calls {
                    back.push(Value::Int(keys.len() as i64));
                    for key in keys {
                        match key {
                            Ok(numbers) => {
                                back.push(Value::Int(numbers.len() as i64));
                                back.extend(numbers.iter().map(|&n| Value::Int(n as i64)));
                            }
                            Err(_) => back.push(Value::BulkString(b"OOM full".to_vec())),
                        }
                    }
                }
                prop_assert_eq!(back, values);
            }
            Ok(())
        })
        .unwrap();
}

#[test]
fn a_key_named_by_several_checks_is_sent_once_and_each_check_says_where_it_is() {
    let keys: Vec<String> = ["a", "b", "a", "a", "c"].map(String::from).to_vec();
    // Two calls: keys a, b; then a, a. Clock, deadline, mode, count; six numbers per check.
    let mut args = vec![3, 0, 0, 0, 0, 2];
    args.extend([1, 10, 11, 12, 13, 14, 2, 20, 21, 22, 23, 24]);
    args.extend([0, 0, 1, 2]);
    args.extend([3, 30, 31, 32, 33, 34, 13, 40, 41, 42, 43, 44]);
    // A third call, of one check each alone on a key no other check names: mode 4.
    args.extend([0, 0, 0, 1]);
    args.extend([1, 50, 51, 52, 53, 54]);
    let numbers = |bytes: &[u8]| -> Vec<i64> {
        bytes
            .chunks(8)
            .map(|b| i64::from_be_bytes(b.try_into().unwrap()))
            .collect()
    };
    let packed = pack(&keys, &args, false).unwrap();
    assert_eq!(packed.keys, ["a", "b", "c"]);
    let mut want = vec![3, 0, 0, 0, 0, 2];
    // b is named by one check only: its place goes negated.
    want.extend([1, 10, 11, 12, 13, 14, 1, 2, 20, 21, 22, 23, 24, -2]);
    want.extend([0, 0, 1, 2]);
    want.extend([3, 30, 31, 32, 33, 34, 1, 13, 40, 41, 42, 43, 44, 1]);
    want.extend([0, 0, 4, 1]);
    want.extend([1, 50, 51, 52, 53, 54, -3]);
    assert_eq!(numbers(&packed.numbers), want);
    // Carried in ARGV: the second number counts the keys sent.
    let carried = pack(&keys, &args, true).unwrap();
    assert_eq!(numbers(&carried.numbers)[1], 3);
    // Arguments that do not match the keys are refused before anything is sent.
    assert!(pack(&keys[..3], &args, false).is_err());
    assert!(pack(&keys, &args[..args.len() - 1], false).is_err());
    assert!(pack(&keys, &[3, 0], false).is_err());
    let mut extra = args.clone();
    extra.push(7);
    assert!(pack(&keys, &extra, false).is_err());
}

#[test]
fn a_binary_reply_reads_as_the_same_numbers() {
    let numbers: [i64; 8] = [
        1_700_000_000_123_456,
        1,
        4,
        1,
        1_700_000_000_123_456,
        3,
        7,
        0,
    ];
    let bytes: Vec<u8> = numbers.iter().flat_map(|n| n.to_be_bytes()).collect();
    let (clock, calls) = parse_reply_with_clock(&Value::BulkString(bytes.clone())).unwrap();
    assert_eq!(clock, Some(1_700_000_000_123_456));
    // The trailing 0: a second call with no keys.
    assert_eq!(
        calls,
        vec![vec![Ok(vec![1, 1_700_000_000_123_456, 3, 7])], vec![]]
    );
    // Not a whole number of integers, or a length past the end: a protocol error.
    for broken in [&bytes[..bytes.len() - 1], &bytes[..40]] {
        assert!(matches!(
            parse_reply(&Value::BulkString(broken.to_vec())),
            Err(StoreError::Protocol(_))
        ));
    }
}

/// `--redis-layout hash`: every charge, refund and post-paid charge of the three algorithms that
/// have a string layout becomes its hash form, which the script reads back (common.lua's
/// HASH_OPS); concurrency and a blocked descriptor stay; claims count the hash forms too.
#[test]
fn the_hash_layout_marks_every_counter_that_has_a_string_form() {
    let ops = [1, 2, 3, 4, 6, 11, 12, 13, 16, 21, 22, 23];
    let mut args = vec![0, 0, 0, ops.len() as i64];
    for op in ops {
        args.extend([op, 0, 0, 0, 0, 0]);
    }
    prefer_hash_layout(&mut args);
    let marked: Vec<i64> = args[4..].chunks(ARGS_PER_KEY).map(|c| c[0]).collect();
    assert_eq!(marked, [5, 7, 8, 4, 6, 15, 17, 18, 16, 25, 27, 28]);

    let limit = |algorithm| crate::algorithm::Limit {
        algorithm,
        requests: 10,
        window_us: 60_000_000,
        burst: 10,
    };
    let check = |algorithm| Check {
        key: "k".into(),
        limit: limit(algorithm),
        hits: 1,
        refund: false,
        post_paid: false,
    };
    let checks = [
        check(Algorithm::SlidingWindow),
        check(Algorithm::TokenBucket),
        check(Algorithm::FixedWindow),
    ];
    let refs: Vec<&Check> = checks.iter().collect();
    let mut args = Vec::new();
    push_call(&refs, ScriptClock::RedisTime, 0, 0, &mut args);
    prefer_hash_layout(&mut args);
    count_claims(&mut args, &refs);
    let counted: Vec<i64> = args[4..].chunks(ARGS_PER_KEY).map(|c| c[0]).collect();
    assert_eq!(counted, [5, 7, 8].map(|op| op + CLAIMS_OP + 1_000 * 60_000));
}
