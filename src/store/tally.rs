//! RLS demand on descriptors RLQS gateways hold part of: what each replica's RLS calls spent
//! there (the store's claimed checks, and the refusals its deny cache answered), tallied
//! between the pushes that hand it to the quota store as demand (`server::demand`), so that
//! the gateways' fair shares leave RLS its part. It must never grow without bound, nor tally a
//! descriptor no gateway holds (every replica's RLS would then hold a slot on it).

use std::collections::HashMap;
use std::sync::Mutex;

use crate::algorithm::key::descriptor_tag;

/// The most counters tallied at once (a replica's quota table's bound, `quota::MAX_QUOTA_KEYS`).
const MAX_TALLIED: usize = 100_000;

/// RLS hits on descriptors gateways hold part of, tallied between two pushes to the quota store
/// as demand-only asks, so that the gateways' fair shares leave RLS its part. A descriptor's
/// counter stays known as held for `HELD_FOR` after the store last said so, so that the calls a
/// deny cache refuses on it (they never reach the store) still count as demand: left out, RLS
/// asked for a fraction of what it was refused, and a gateway beside it kept nearly the whole
/// rule. Bounded: a counter past `MAX_TALLIED` is not tallied until others are dropped.
#[derive(Default)]
pub struct RlsTally {
    /// Per counter key: hits seen since the last take, the layer's rate (requests per second),
    /// when the store last found it held.
    map: Mutex<HashMap<String, Tallied>>,
}

struct Tallied {
    hits: u64,
    capacity: f64,
    held_at: std::time::Instant,
}

/// How long a counter the store found held is taken to stay held.
const HELD_FOR: std::time::Duration = std::time::Duration::from_secs(10);

impl RlsTally {
    /// An RLS charge of `hits` on `counter_key`, a layer of `capacity` requests a second, that
    /// the store found held.
    pub fn note(&self, counter_key: &str, hits: u64, capacity: f64) {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        let now = std::time::Instant::now();
        if let Some(entry) = map.get_mut(counter_key) {
            entry.hits = entry.hits.saturating_add(hits);
            entry.capacity = capacity;
            entry.held_at = now;
        } else if map.len() < MAX_TALLIED {
            map.insert(
                counter_key.to_owned(),
                Tallied {
                    hits,
                    capacity,
                    held_at: now,
                },
            );
        }
    }

    /// An RLS charge of `hits` on `counter_key` refused without asking the store (a refusal it
    /// remembered): tallied when the store found the counter held lately.
    pub fn note_remembered(&self, counter_key: &str, hits: u64) {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(entry) = map.get_mut(counter_key) {
            entry.hits = entry.hits.saturating_add(hits);
        }
    }

    /// Whether the store found `counter_key` held by RLQS gateways within `HELD_FOR`.
    pub fn is_held(&self, counter_key: &str) -> bool {
        let map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        map.get(counter_key)
            .is_some_and(|t| t.held_at.elapsed() < HELD_FOR)
    }

    /// Everything tallied since the last take, per descriptor: (tag, hits, rate). Each layer of
    /// a descriptor counts the same hits: a descriptor's are its busiest layer's, at its
    /// lowest rate. Counters the store has not found held for `HELD_FOR` are forgotten.
    pub fn take(&self) -> Vec<(String, u64, f64)> {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        let now = std::time::Instant::now();
        let mut tags: HashMap<String, (u64, f64)> = HashMap::new();
        map.retain(|key, t| {
            if t.hits > 0 {
                let entry = tags
                    .entry(descriptor_tag(key).to_owned())
                    .or_insert((0, f64::INFINITY));
                entry.0 = entry.0.max(t.hits);
                entry.1 = entry.1.min(t.capacity);
                t.hits = 0;
            }
            now.duration_since(t.held_at) < HELD_FOR
        });
        tags.into_iter()
            .map(|(tag, (hits, rate))| (tag, hits, rate))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Refusals a deny cache answers count as demand on a counter the store found held, and
    /// only there (a descriptor no gateway holds gets no RLS holder).
    #[test]
    fn remembered_refusals_count_on_held_counters_only() {
        let tally = RlsTally::default();
        tally.note("{d|t=a}:s:1000000us", 3, 10.0);
        tally.note_remembered("{d|t=a}:s:1000000us", 27);
        tally.note_remembered("{d|t=b}:s:1000000us", 50);
        assert_eq!(tally.take(), vec![("{d|t=a}".to_owned(), 30, 10.0)]);
        // Still known as held after a take: the next second's refusals count too.
        tally.note_remembered("{d|t=a}:s:1000000us", 30);
        assert_eq!(tally.take(), vec![("{d|t=a}".to_owned(), 30, 10.0)]);
        assert!(tally.take().is_empty());
    }
}
