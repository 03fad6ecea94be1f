//! What a decision's `reset_after` and `retry_after` must be, worked out from the state Redis
//! itself stored after the call, by the documented meaning of each (docs/algorithms.md), in this
//! file's own arithmetic: the memory store and the Redis store turn a state into a decision with
//! the same Rust (`summarize`), so comparing the two alone cannot catch a defect there (issue 48).
//! It must never call the library's `summarize` or read the script's reply.

use super::*;

/// The stored state of a check's key, and what the decision said of it.
pub(super) struct Seen<'a> {
    pub check: &'a Check,
    pub decision: &'a portcullis::algorithm::Decision,
    pub now: u64,
    /// Where the assertion says it failed (case, step).
    pub at: String,
}

/// Asserts the reset and retry times of one decision against the key's stored state. A key
/// named twice in one call is left out by the caller (its state at the end is the second's),
/// and so are zero limits (never sent to Redis) and concurrency (no window to wait for).
pub(super) async fn assert_times(conn: &mut redis::aio::MultiplexedConnection, seen: Seen<'_>) {
    let key = format!("model:{}", seen.check.key);
    let expected = match seen.check.limit.algorithm {
        Algorithm::FixedWindow => fixed(conn, &key, &seen).await,
        Algorithm::SlidingWindow => sliding(conn, &key, &seen).await,
        Algorithm::TokenBucket => bucket(conn, &key, &seen).await,
        Algorithm::Concurrency => return,
    };
    let Some((reset, retry)) = expected else {
        return;
    };
    let what = format!("{}: {:?} {:?}", seen.at, seen.check, seen.decision);
    assert_eq!(
        seen.decision.reset_after,
        Duration::from_micros(reset),
        "{what}"
    );
    // A post-paid charge's or a refund's retry follows whether it was recorded: left out.
    if !seen.check.post_paid && !seen.check.refund {
        assert_eq!(
            seen.decision.retry_after,
            retry.map(Duration::from_micros),
            "{what}"
        );
    }
}

/// A fixed window: the end of the window the call counted in (the stored window, in either
/// layout, or the current one if the clock stepped back past it); a refused charge waits for it, unless it asks more
/// than the limit (waiting never helps).
async fn fixed(
    conn: &mut redis::aio::MultiplexedConnection,
    key: &str,
    seen: &Seen<'_>,
) -> Option<(u64, Option<u64>)> {
    let kind: String = redis::cmd("TYPE")
        .arg(key)
        .query_async(conn)
        .await
        .expect("TYPE");
    let stored: Option<u64> = if kind == "string" {
        // The string layout: the window index, then the count, each 8 bytes big-endian.
        let raw: Vec<u8> = redis::cmd("GET")
            .arg(key)
            .query_async(conn)
            .await
            .expect("GET");
        assert_eq!(raw.len(), 16, "a fixed window's string");
        Some(u64::from_be_bytes(raw[..8].try_into().expect("8 bytes")))
    } else {
        redis::cmd("HGET")
            .arg(key)
            .arg("w")
            .query_async(conn)
            .await
            .expect("HGET")
    };
    let stored = stored?;
    let (w, now) = (seen.check.limit.window_us, seen.now);
    let reset = (stored.max(now / w) + 1) * w - now;
    let refused = !seen.decision.allowed && seen.check.hits <= seen.check.limit.requests;
    Some((reset, refused.then_some(reset.max(1))))
}

/// A sliding window's live sub-windows (index, count), oldest first, read from the key in
/// whichever layout it is stored: the packed string (full or short) or the hash. Live: within
/// the 61 sub-windows ending at the newer of the stored newest and the current one.
async fn sliding_live(
    conn: &mut redis::aio::MultiplexedConnection,
    key: &str,
    current: u64,
) -> Vec<(u64, u64)> {
    let kind: String = redis::cmd("TYPE")
        .arg(key)
        .query_async(conn)
        .await
        .expect("TYPE");
    let be = |bytes: &[u8]| bytes.iter().fold(0u64, |n, b| n << 8 | u64::from(*b));
    let (newest, mut pairs) = match kind.as_str() {
        "none" => return Vec::new(),
        "string" => {
            let raw: Vec<u8> = redis::cmd("GET")
                .arg(key)
                .query_async(conn)
                .await
                .expect("GET");
            if raw[0] == 1 {
                // The short form: 1, the sub-window (6 bytes), its count (4 bytes).
                assert_eq!(raw.len(), 11, "{key}: {raw:?}");
                let n = be(&raw[1..7]);
                (n, vec![(n, be(&raw[7..11]))])
            } else {
                // 1 byte of width, n (6), the total (6), one byte, then 61 counts.
                let width = usize::from(raw[0]);
                assert_eq!(raw.len(), 14 + 61 * width, "{key}: {raw:?}");
                let n = be(&raw[1..7]);
                let pairs = (n.saturating_sub(60)..=n)
                    .map(|i| {
                        let at = 14 + (i % 61) as usize * width;
                        (i, be(&raw[at..at + width]))
                    })
                    .collect();
                (n, pairs)
            }
        }
        "hash" => {
            let fields: Vec<(String, u64)> = redis::cmd("HGETALL")
                .arg(key)
                .query_async(conn)
                .await
                .expect("HGETALL");
            let field = |name: &str| fields.iter().find(|(f, _)| f == name).map(|(_, v)| *v);
            let n = field("n").unwrap_or(0);
            let pairs: Vec<(u64, u64)> = fields
                .iter()
                .filter_map(|(f, v)| f.parse::<u64>().ok().map(|i| (i, *v)))
                .collect();
            // What every read relies on: a hash holds only the sub-windows of its own window
            // (the ones that left are deleted when it moves on, or it would grow while busy),
            // each with hits, `t` their sum and `l` the newest.
            assert!(
                pairs
                    .iter()
                    .all(|&(i, count)| i + 60 >= n && i <= n && count > 0),
                "{key}: sub-windows outside [n - 60, n] or empty: {fields:?}"
            );
            let sum: u64 = pairs.iter().map(|(_, count)| count).sum();
            let newest_with_hits = pairs.iter().map(|(i, _)| *i).max();
            assert_eq!(
                field("t"),
                Some(sum),
                "{key}: `t` is not their sum: {fields:?}"
            );
            assert_eq!(
                field("l"),
                newest_with_hits,
                "{key}: `l` is not the newest: {fields:?}"
            );
            (n, pairs)
        }
        other => panic!("{key} is a {other}"),
    };
    let newest = newest.max(current);
    pairs.retain(|&(i, count)| count > 0 && i + 60 >= newest && i <= newest);
    pairs.sort_unstable();
    pairs
}

/// A sliding window: the reset is when the newest sub-window holding hits leaves the window
/// (a sub-window b counts until (b + 61) sub-windows from the epoch); a refused charge waits
/// until enough of the oldest hits have left for it to fit.
async fn sliding(
    conn: &mut redis::aio::MultiplexedConnection,
    key: &str,
    seen: &Seen<'_>,
) -> Option<(u64, Option<u64>)> {
    let limit = &seen.check.limit;
    let sub = limit.window_us.div_ceil(60).max(1);
    let now = seen.now;
    let live = sliding_live(conn, key, now / sub).await;
    let leaves = |i: u64| ((i + 61) * sub).saturating_sub(now);
    let reset = live.last().map_or(0, |&(i, _)| leaves(i));
    let retry = if seen.decision.allowed || seen.check.hits > limit.requests {
        None
    } else {
        let total: u64 = live.iter().map(|(_, c)| c).sum();
        let need = (total + seen.check.hits).saturating_sub(limit.requests);
        let mut freed = 0;
        live.iter().find_map(|&(i, count)| {
            freed += count;
            (freed >= need).then(|| leaves(i).max(1))
        })
    };
    Some((reset, retry))
}

/// A token bucket (GCRA): the reset is when the bucket is full again (its stored theoretical
/// arrival time, `t` whole microseconds and `f` parts of 1/`r`, less now, rounded up); a refused
/// charge waits until its hits fit under the burst. In this file's terms: one hit's cost is
/// window/requests, the burst's tolerance burst × window/requests.
async fn bucket(
    conn: &mut redis::aio::MultiplexedConnection,
    key: &str,
    seen: &Seen<'_>,
) -> Option<(u64, Option<u64>)> {
    let limit = &seen.check.limit;
    let (t, f, r) = bucket_state(conn, key).await;
    let (mut t, mut f) = (t.unwrap_or(0), f.unwrap_or(0));
    // A fraction counted in another rate (a reload) is a whole microsecond more.
    if f > 0 && r != Some(limit.requests) {
        (t, f) = (t + 1, 0);
    }
    let now = seen.now;
    let rate = u128::from(limit.requests.max(1));
    // What is still to refill, in parts of 1/requests of a microsecond.
    let owed = if t > now || (t == now && f > 0) {
        u128::from(t - now) * rate + u128::from(f)
    } else {
        0
    };
    // Spans past 2^52 us are answered as 2^52 (the model's cap on a bucket's span).
    let cap = |parts: u128| u64::try_from(parts.div_ceil(rate)).map_or(1 << 52, |v| v.min(1 << 52));
    let reset = cap(owed);
    let window = u128::from(limit.window_us);
    let retry = (!seen.decision.allowed && seen.check.hits <= limit.burst).then(|| {
        let wanted = owed + u128::from(seen.check.hits) * window;
        cap(wanted.saturating_sub(u128::from(limit.burst) * window)).max(1)
    });
    Some((reset, retry))
}

/// A bucket's stored (t, f, r) in either layout: 0.1.0's hash, or the string of big-endian
/// 64-bit integers (t alone when f is 0: f then reads as 0, r as none).
async fn bucket_state(
    conn: &mut redis::aio::MultiplexedConnection,
    key: &str,
) -> (Option<u64>, Option<u64>, Option<u64>) {
    let kind: String = redis::cmd("TYPE")
        .arg(key)
        .query_async(conn)
        .await
        .expect("TYPE");
    if kind != "string" {
        return redis::cmd("HMGET")
            .arg(key)
            .arg("t")
            .arg("f")
            .arg("r")
            .query_async(conn)
            .await
            .expect("HMGET");
    }
    let raw: Vec<u8> = redis::cmd("GET")
        .arg(key)
        .query_async(conn)
        .await
        .expect("GET");
    let at = |i: usize| {
        raw.get(i * 8..i * 8 + 8)
            .map(|b| u64::from_be_bytes(b.try_into().expect("8 bytes")))
    };
    match raw.len() {
        8 => (at(0), Some(0), None),
        24 => (at(0), at(1), at(2)),
        n => panic!("a bucket's string of {n} bytes"),
    }
}
