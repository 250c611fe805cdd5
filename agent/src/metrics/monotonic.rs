//! Cumulative counters that never go backwards, from readings that may.
//!
//! The usage region's counters (launches, warps, throttled time) live in a
//! file the container can write: a region recreated by a restarted process
//! starts again from zero, and a hostile tenant can write any value at any
//! time. Prometheus reads a decrease as a counter reset and would count the
//! whole new value again, so a reading is never exported as is: each
//! reading adds its increase over the previous reading, a decrease adds
//! nothing and becomes the new baseline, and the sum saturates at
//! `u64::MAX` instead of wrapping.
//!
//! Invariant: [`Monotonic::advance`] never returns less than it returned
//! before for the same key.

use std::collections::HashMap;
use std::hash::Hash;

/// One counter: the last reading and the exported total.
#[derive(Debug, Clone, Copy)]
struct Track {
    last: u64,
    total: u64,
}

/// Monotonic totals by key (e.g. container, GPU, counter name).
#[derive(Debug)]
pub struct Monotonic<K> {
    tracks: HashMap<K, Track>,
    seen: Vec<K>,
}

impl<K: Eq + Hash + Clone> Default for Monotonic<K> {
    fn default() -> Self {
        Self {
            tracks: HashMap::new(),
            seen: Vec::new(),
        }
    }
}

impl<K: Eq + Hash + Clone> Monotonic<K> {
    /// Feeds `key`'s reading of this period; returns its exported total.
    /// A key seen for the first time starts at its reading (what the
    /// counter accumulated before the agent watched it is real use).
    pub fn advance(&mut self, key: K, reading: u64) -> u64 {
        self.seen.push(key.clone());
        let t = self.tracks.entry(key).or_insert(Track {
            last: reading,
            total: reading,
        });
        if reading > t.last {
            t.total = t.total.saturating_add(reading - t.last);
        }
        t.last = reading;
        t.total
    }

    /// Forgets every key not fed since the previous call (a container or
    /// GPU that is gone): a key that comes back starts again.
    pub fn end_period(&mut self) {
        let seen: std::collections::HashSet<K> = self.seen.drain(..).collect();
        self.tracks.retain(|k, _| seen.contains(k));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decreases_and_rewrites_never_lower_the_total() {
        let mut m = Monotonic::default();
        assert_eq!(m.advance("a", 10), 10);
        assert_eq!(m.advance("a", 15), 15);
        // Region recreated: starts from zero, counts on from there.
        assert_eq!(m.advance("a", 0), 15);
        assert_eq!(m.advance("a", 4), 19);
        // A tenant writes a huge value, then a small one, then huge again.
        assert_eq!(m.advance("a", u64::MAX), u64::MAX);
        assert_eq!(m.advance("a", 1), u64::MAX);
        assert_eq!(m.advance("a", u64::MAX), u64::MAX, "saturates, never wraps");
    }

    #[test]
    fn gone_keys_are_forgotten() {
        let mut m = Monotonic::default();
        m.advance("a", 10);
        m.advance("b", 10);
        m.end_period();
        m.advance("a", 11);
        m.end_period();
        assert_eq!(m.advance("b", 3), 3, "b was gone and starts again");
        assert_eq!(m.advance("a", 12), 12);
    }
}
