//! The script's reply parsed exactly, or refused as a protocol error, never a panic.

use super::*;

fn bulk(text: &str) -> Value {
    Value::BulkString(text.as_bytes().to_vec())
}

#[test]
fn the_reply_splits_into_calls_keys_and_numbers() {
    let reply = bulk("1 1700000000000000 3 28333333333,0 9007199254740991 0 5 2 7;1 2 3 4");
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
    assert_eq!(parse_reply(&bulk("")).unwrap(), Replies::new());
    assert_eq!(
        parse_reply(&bulk(";1 2")).unwrap(),
        vec![vec![], vec![Ok(vec![1, 2])]]
    );
}

#[test]
fn the_reply_tells_the_nodes_clock_even_when_every_call_expired() {
    let (clock, calls) =
        parse_reply_with_clock(&bulk("@1700000000123456|!EXPIRED portcullis: late")).unwrap();
    assert_eq!(clock, Some(1_700_000_000_123_456));
    assert!(calls[0][0].is_err());
    let (clock, calls) = parse_reply_with_clock(&bulk("@5|")).unwrap();
    assert_eq!((clock, calls), (Some(5), Replies::new()));
    // A fixed test clock: no TIME read, no clock told.
    assert_eq!(parse_reply_with_clock(&bulk("1 2")).unwrap().0, None);
    for broken in ["@12", "@|1 2", "@x|1 2"] {
        assert!(matches!(
            parse_reply_with_clock(&bulk(broken)),
            Err(StoreError::Protocol(_))
        ));
    }
}

#[test]
fn a_key_the_script_failed_fails_alone_with_what_redis_said() {
    let reply = bulk("1 2 3 4,!OOM command not allowed when used memory > 'maxmemory'.;0 5 6 7");
    let calls = parse_reply(&reply).unwrap();
    assert_eq!(calls[0][0], Ok(vec![1, 2, 3, 4]));
    assert!(matches!(&calls[0][1], Err(StoreError::Unavailable(m)) if m.contains("out of memory")));
    assert_eq!(calls[1][0], Ok(vec![0, 5, 6, 7]));
    let wrong = parse_reply(&bulk("!WRONGTYPE Operation against a key")).unwrap();
    assert!(wrong[0][0].as_ref().is_err_and(StoreError::is_permanent));
}

#[test]
fn a_reply_that_is_not_numbers_is_a_protocol_error() {
    for text in [
        "1 -2 3 4",
        "1 2.5 3 4",
        "1  2",
        "1 2,",
        "18446744073709551616",
        "1e15",
        "nil",
    ] {
        assert!(
            matches!(parse_reply(&bulk(text)), Err(StoreError::Protocol(_))),
            "{text:?} parsed"
        );
    }
    for value in [Value::Nil, Value::Int(1), Value::Array(vec![Value::Int(1)])] {
        assert!(matches!(parse_reply(&value), Err(StoreError::Protocol(_))));
    }
    // The end of the range parses.
    assert_eq!(
        parse_reply(&bulk("18446744073709551615")).unwrap(),
        vec![vec![Ok(vec![u64::MAX])]]
    );
}

#[test]
fn any_bytes_parse_or_fail_without_panicking() {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};
    let mut runner = TestRunner::new(Config {
        cases: 2000,
        failure_persistence: None,
        rng_seed: proptest::test_runner::RngSeed::Fixed(0x5EED_0010),
        ..Config::default()
    });
    let bytes = proptest::collection::vec(
        prop_oneof![
            Just(b';'),
            Just(b','),
            Just(b' '),
            Just(b'!'),
            b'0'..=b'9',
            any::<u8>()
        ],
        0..64,
    );
    runner
        .run(&bytes, |bytes| {
            let value = Value::BulkString(bytes.clone());
            if let Ok(calls) = parse_reply(&value) {
                // What parses is exactly what was sent: printing it back gives the bytes.
                let printed = calls
                    .iter()
                    .map(|keys| {
                        keys.iter()
                            .map(|n| match n {
                                Ok(n) => n.iter().map(u64::to_string).collect::<Vec<_>>().join(" "),
                                Err(_) => "!".into(),
                            })
                            .collect::<Vec<_>>()
                            .join(",")
                    })
                    .collect::<Vec<_>>()
                    .join(";");
                let canonical = !bytes.contains(&b'!')
                    && bytes
                        .split(|&b| b == b' ' || b == b',' || b == b';')
                        .all(|n| n.is_empty() || n == b"0" || n[0] != b'0');
                if canonical {
                    prop_assert_eq!(printed.into_bytes(), bytes);
                }
            }
            Ok(())
        })
        .unwrap();
}
