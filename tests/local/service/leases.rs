//! Concurrency leases are owned (issue 43 item 6): each take is answered with a token naming its
//! leases (`lease` in the dynamic metadata), and a release of that token frees those and no
//! other, so a request that ran past its lease cannot free the slot another took since.

use super::*;

fn release(user: &str, token: &str) -> RateLimitRequest {
    let mut r = request("cc", &[&[("user", user)]]);
    r.descriptors[0].hits_addend = Some(token.parse().expect("a number"));
    r.descriptors[0].is_negative_hits = true;
    r
}

/// The slots free for `user` now (a check-only call).
async fn free(server: &TestServer, user: &str) -> u32 {
    let mut probe = request("cc", &[&[("user", user)]]);
    probe.descriptors[0].hits_addend = Some(0);
    server.ok(probe).await.statuses[0].limit_remaining
}

/// Issue 43's case through the service: one slot, a lease of a second. A runs past its lease, B
/// takes the slot, A's release comes late: C is still refused while B is in flight. Before leases
/// were owned, A's release freed the earliest lease, B's, and C was admitted: two in flight.
#[tokio::test]
async fn a_late_release_frees_nothing_and_c_waits_for_b() {
    const RULES: &str = "domain: cc
descriptors:
  - key: user
    rate_limit: {algorithm: concurrency, requests_per_unit: 1, unit: minute, max_duration: 1s}
";
    let server = TestServer::start(&[("cc.yaml", RULES)]).await;
    let take = || request("cc", &[&[("user", "u")]]);
    let a = server.ok(take()).await;
    assert_eq!(a.overall_code, OK);
    let [(_, a_lease)] = &meta(&a, "lease")[..] else {
        panic!("one lease: {a:?}")
    };
    // A runs past its lease (the server's clock moved by hand): the slot is free by itself.
    server.clock.advance_us(1_100_000);
    assert_eq!(free(&server, "u").await, 1, "A's lease ended");
    let b = server.ok(take()).await;
    assert_eq!(b.overall_code, OK);
    let [(_, b_lease)] = &meta(&b, "lease")[..] else {
        panic!("one lease: {b:?}")
    };
    assert_ne!(a_lease, b_lease);
    // A ends: Envoy sends its release with what A was answered.
    server.ok(release("u", a_lease)).await;
    let c = server.ok(take()).await;
    assert_eq!(
        c.overall_code, OVER,
        "C admitted while B is in flight: A's late release freed B's slot"
    );
    assert_eq!(meta(&c, "lease"), [("user".into(), "0".into())]);
    // C's release (it took nothing) frees nothing either; B's own release frees B's slot.
    server.ok(release("u", "0")).await;
    assert_eq!(free(&server, "u").await, 0);
    server.ok(release("u", b_lease)).await;
    assert_eq!(free(&server, "u").await, 1);
    // 0.1.0's form, a count of slots (`held`), still frees the earliest lease.
    let d = server.ok(take()).await;
    assert_eq!(meta(&d, "held"), [("user".into(), "1".into())]);
    server.ok(release("u", "1")).await;
    assert_eq!(free(&server, "u").await, 1);
    server.stop().await;
}

/// Two concurrency descriptors with the same keys in one call each get an entry of their own
/// (the second `user#2`), and each release frees its own descriptor's leases.
#[tokio::test]
async fn descriptors_with_the_same_keys_each_name_their_own_lease() {
    const RULES: &str = "domain: cc
descriptors:
  - key: user
    rate_limit: {algorithm: concurrency, requests_per_unit: 2, unit: minute}
";
    let server = TestServer::start(&[("cc.yaml", RULES)]).await;
    let both = server
        .ok(request("cc", &[&[("user", "a")], &[("user", "b")]]))
        .await;
    assert_eq!(both.overall_code, OK);
    let held = meta(&both, "held");
    assert_eq!(
        held,
        [("user".into(), "1".into()), ("user#2".into(), "1".into())]
    );
    let leases = meta(&both, "lease");
    let names: Vec<&str> = leases.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(names, ["user", "user#2"]);
    // A second take on each, so that each descriptor holds two leases.
    server
        .ok(request("cc", &[&[("user", "a")], &[("user", "b")]]))
        .await;
    assert_eq!((free(&server, "a").await, free(&server, "b").await), (0, 0));
    // Each release frees its own descriptor's first lease, and only that one.
    server.ok(release("a", &leases[0].1)).await;
    assert_eq!((free(&server, "a").await, free(&server, "b").await), (1, 0));
    server.ok(release("b", &leases[1].1)).await;
    assert_eq!((free(&server, "a").await, free(&server, "b").await), (1, 1));
    // Released again (Envoy retries nothing, but a duplicate must be harmless): nothing more.
    server.ok(release("a", &leases[0].1)).await;
    assert_eq!(free(&server, "a").await, 1);
    server.stop().await;
}

/// A plain descriptor before a concurrency one with the same keys: the concurrency one is the
/// call's second `user` descriptor, `user#2`, as `portcullis ask` and the docs count. It was
/// named `user` (only concurrency descriptors were counted), and `ask` released nothing.
#[tokio::test]
async fn a_descriptor_is_named_by_its_place_among_all_of_the_same_keys() {
    const RULES: &str = "domain: cc
descriptors:
  - key: user
    value: plain
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: user
    rate_limit: {algorithm: concurrency, requests_per_unit: 1, unit: minute}
";
    let server = TestServer::start(&[("cc.yaml", RULES)]).await;
    let r = server
        .ok(request("cc", &[&[("user", "plain")], &[("user", "u")]]))
        .await;
    assert_eq!(r.overall_code, OK);
    assert_eq!(meta(&r, "held"), [("user#2".into(), "1".into())]);
    let [(name, _)] = &meta(&r, "lease")[..] else {
        panic!("one lease: {r:?}")
    };
    assert_eq!(name, "user#2");
    server.stop().await;
}
