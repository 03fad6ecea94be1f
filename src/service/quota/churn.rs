//! Streams churned on one connection: a stream that was granted part of a descriptor and ended
//! leaves its claim standing until its assignment ends and the rule's window after (Envoy may
//! still admit on it), so a client opening and closing streams in a loop would pile claims on
//! the descriptor (its holder slots, and on a long window its budget) and deny it to every other
//! gateway for the window. Per connection and descriptor, this counts the streams holding it and
//! the ended ones whose claims still stand, and refuses that connection's new holds there past
//! `MOST_ENDED_PER_CONNECTION`: the churner is refused, a gateway on another connection is not.
//! A client that opens a new connection for each stream is counted by its address instead, for
//! the streams that ended quickly (Envoy keeps one stream for its connection's life). Bounded in
//! connections, addresses and descriptors; it must never refuse a connection or an address that
//! has not churned.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// Streams holding a descriptor, or ended with their claims standing there, one connection may
/// have before its new streams are refused on it. Envoy keeps one RLQS stream per connection; a
/// stream that a drain or a maximum connection age ends goes with its connection.
pub const MOST_ENDED_PER_CONNECTION: u32 = 8;

/// A stream that ends within this many reporting intervals of opening ended quickly: it counts
/// against its address as well as its connection.
pub const QUICK_INTERVALS: u32 = 2;

/// Connections followed, and addresses; past it the one idle longest is forgotten.
const MAX_CONNECTIONS: usize = 4096;
/// Descriptors followed per connection; past it the one whose claims end first is forgotten.
const MAX_DESCRIPTORS: usize = 256;

#[derive(Default)]
pub(super) struct ChurnGuard {
    connections: Mutex<HashMap<SocketAddr, Connection>>,
    /// Per address: its streams that ended quickly with claims standing (`ended` only).
    addresses: Mutex<HashMap<IpAddr, Connection>>,
}

#[derive(Default)]
struct Connection {
    /// Per descriptor: its streams holding it now.
    live: HashMap<String, u32>,
    /// Per descriptor: ended streams whose claims stand, and until when the last one does.
    ended: HashMap<String, (u32, Instant)>,
    last_seen: Option<Instant>,
}

impl Connection {
    fn standing(&self, key: &str, now: Instant) -> u32 {
        let ended = self
            .ended
            .get(key)
            .filter(|(_, until)| *until > now)
            .map_or(0, |(count, _)| *count);
        ended.saturating_add(self.live.get(key).copied().unwrap_or(0))
    }
}

impl ChurnGuard {
    /// A stream of `peer` takes a hold on `key` at `now`: refused (false) when the
    /// connection's live streams there and its ended ones whose claims stand reach
    /// `MOST_ENDED_PER_CONNECTION`; an unknown peer always may. A hold taken is `release`d
    /// when its stream ends.
    pub(super) fn hold(&self, peer: Option<SocketAddr>, key: &str, now: Instant) -> bool {
        let Some(peer) = peer else { return true };
        let quick = {
            let mut addresses = lock(&self.addresses);
            entry(&mut addresses, peer.ip(), now).standing(key, now)
        };
        let mut connections = lock(&self.connections);
        let connection = entry(&mut connections, peer, now);
        if quick.max(connection.standing(key, now)) >= MOST_ENDED_PER_CONNECTION {
            return false;
        }
        if !connection.live.contains_key(key) && connection.live.len() >= MAX_DESCRIPTORS {
            // More descriptors than followed on one connection: not followed (its stream's
            // own bounds hold it).
            return true;
        }
        *connection.live.entry(key.to_owned()).or_default() += 1;
        true
    }

    /// The stream of `peer` that held `key` ended at `now`; `claim` is how long its claim
    /// stands on (`None`: it was granted nothing); `quick`: it ended within `QUICK_INTERVALS`
    /// reporting intervals of opening.
    pub(super) fn release(
        &self,
        peer: Option<SocketAddr>,
        key: &str,
        claim: Option<Duration>,
        quick: bool,
        now: Instant,
    ) {
        let Some(peer) = peer else { return };
        {
            let mut connections = lock(&self.connections);
            let connection = entry(&mut connections, peer, now);
            if let Some(live) = connection.live.get_mut(key) {
                *live -= 1;
                if *live == 0 {
                    connection.live.remove(key);
                }
            }
            if let Some(stands) = claim {
                connection.ended_one(key, now + stands, now);
            }
        }
        if let Some(stands) = claim.filter(|_| quick) {
            let mut addresses = lock(&self.addresses);
            entry(&mut addresses, peer.ip(), now).ended_one(key, now + stands, now);
        }
    }
}

impl Connection {
    /// One more ended stream on `key` whose claim stands until `until`.
    fn ended_one(&mut self, key: &str, until: Instant, now: Instant) {
        self.ended.retain(|_, (_, until)| *until > now);
        if !self.ended.contains_key(key) && self.ended.len() >= MAX_DESCRIPTORS {
            let first = self
                .ended
                .iter()
                .min_by_key(|(_, (_, until))| *until)
                .map(|(k, _)| k.clone());
            if let Some(first) = first {
                self.ended.remove(&first);
            }
        }
        let entry = self.ended.entry(key.to_owned()).or_insert((0, now));
        entry.0 = entry.0.saturating_add(1);
        entry.1 = entry.1.max(until);
    }
}

/// `peer`'s entry, made if need be (past `MAX_CONNECTIONS`, the one idle longest goes).
fn entry<K: std::hash::Hash + Eq + Copy>(
    connections: &mut HashMap<K, Connection>,
    peer: K,
    now: Instant,
) -> &mut Connection {
    if !connections.contains_key(&peer) && connections.len() >= MAX_CONNECTIONS {
        let idlest = connections
            .iter()
            .min_by_key(|(_, c)| c.last_seen)
            .map(|(p, _)| *p);
        if let Some(idlest) = idlest {
            connections.remove(&idlest);
        }
    }
    let connection = connections.entry(peer).or_default();
    connection.last_seen = Some(now);
    connection
}

fn lock<K>(
    map: &Mutex<HashMap<K, Connection>>,
) -> std::sync::MutexGuard<'_, HashMap<K, Connection>> {
    map.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_is_refused_past_its_streams_until_their_claims_end() {
        let guard = ChurnGuard::default();
        let churner: SocketAddr = ([127, 0, 0, 1], 5000).into();
        let other: SocketAddr = ([127, 0, 0, 1], 5001).into();
        let start = Instant::now();
        let minute = Duration::from_secs(60);
        for _ in 0..MOST_ENDED_PER_CONNECTION {
            assert!(guard.hold(Some(churner), "{d}", start));
            guard.release(Some(churner), "{d}", Some(minute), false, start);
        }
        assert!(!guard.hold(Some(churner), "{d}", start));
        // Another descriptor, another connection, an unknown peer: not refused.
        assert!(guard.hold(Some(churner), "{e}", start));
        assert!(guard.hold(Some(other), "{d}", start));
        assert!(guard.hold(None, "{d}", start));
        // Once the last claim has ended, the connection may hold the descriptor again.
        let later = start + minute + Duration::from_secs(1);
        assert!(guard.hold(Some(churner), "{d}", later));
        // A stream granted nothing leaves nothing standing when it ends.
        let fresh: SocketAddr = ([127, 0, 0, 1], 5002).into();
        for _ in 0..2 * MOST_ENDED_PER_CONNECTION {
            assert!(guard.hold(Some(fresh), "{d}", start));
            guard.release(Some(fresh), "{d}", None, true, start);
        }
    }

    /// A client opening a new connection for each stream is refused by its address once its
    /// quickly ended streams' claims stand past the bound; a gateway at another address is not,
    /// nor are streams that lived (a connection's age, a drain), however many.
    #[test]
    fn an_address_whose_streams_end_quickly_on_new_connections_is_refused() {
        let guard = ChurnGuard::default();
        let start = Instant::now();
        let minute = Some(Duration::from_secs(60));
        let at = |ip: [u8; 4], port: u16| Some(SocketAddr::from((ip, port)));
        for port in 0..MOST_ENDED_PER_CONNECTION as u16 {
            assert!(guard.hold(at([127, 0, 0, 1], port), "{d}", start));
            guard.release(at([127, 0, 0, 1], port), "{d}", minute, true, start);
        }
        assert!(!guard.hold(at([127, 0, 0, 1], 999), "{d}", start));
        assert!(guard.hold(at([127, 0, 0, 2], 999), "{d}", start));
        assert!(guard.hold(at([127, 0, 0, 1], 999), "{e}", start));
        let later = start + Duration::from_secs(61);
        assert!(guard.hold(at([127, 0, 0, 1], 1000), "{d}", later));
        // Streams that lived: counted per connection only.
        for port in 0..4 * MOST_ENDED_PER_CONNECTION as u16 {
            assert!(guard.hold(at([127, 0, 0, 3], port), "{d}", start));
            guard.release(at([127, 0, 0, 3], port), "{d}", minute, false, start);
        }
    }

    /// Live streams count at once (a stream's end is recorded after the next may have opened).
    #[test]
    fn live_streams_count_before_they_end() {
        let guard = ChurnGuard::default();
        let churner: SocketAddr = ([127, 0, 0, 1], 5000).into();
        let now = Instant::now();
        for _ in 0..MOST_ENDED_PER_CONNECTION {
            assert!(guard.hold(Some(churner), "{d}", now));
        }
        assert!(!guard.hold(Some(churner), "{d}", now));
    }

    #[test]
    fn connections_and_their_descriptors_are_bounded() {
        let guard = ChurnGuard::default();
        let now = Instant::now();
        let minute = Some(Duration::from_secs(60));
        for port in 0..(MAX_CONNECTIONS as u16 + 10) {
            let peer = Some(([127, 0, 0, 1], port).into());
            guard.hold(peer, "{d}", now);
            guard.release(peer, "{d}", minute, true, now);
        }
        assert_eq!(lock(&guard.connections).len(), MAX_CONNECTIONS);
        assert!(lock(&guard.addresses).len() <= MAX_CONNECTIONS);
        let one: SocketAddr = ([127, 0, 0, 2], 1).into();
        for d in 0..MAX_DESCRIPTORS + 10 {
            let key = format!("{{d{d}}}");
            guard.hold(Some(one), &key, now);
            guard.release(Some(one), &key, minute, true, now);
        }
        assert_eq!(lock(&guard.connections)[&one].ended.len(), MAX_DESCRIPTORS);
        assert_eq!(
            lock(&guard.addresses)[&one.ip()].ended.len(),
            MAX_DESCRIPTORS
        );
    }
}
