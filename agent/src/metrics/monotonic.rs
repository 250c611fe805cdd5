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
//! Invariant: [`Counter::advance`] never returns less than it returned
//! before on the same counter.

/// One exported counter: the last reading and the exported total.
#[derive(Debug, Clone, Copy, Default)]
pub struct Counter {
    last: Option<u64>,
    total: u64,
}

impl Counter {
    /// Feeds this period's reading; returns the exported total. The first
    /// reading is taken whole (what accumulated before the agent watched
    /// is real use).
    pub fn advance(&mut self, reading: u64) -> u64 {
        let increase = match self.last {
            None => reading,
            Some(last) => reading.saturating_sub(last),
        };
        self.total = self.total.saturating_add(increase);
        self.last = Some(reading);
        self.total
    }

    /// The exported total.
    pub fn total(&self) -> u64 {
        self.total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decreases_and_rewrites_never_lower_the_total() {
        let mut c = Counter::default();
        assert_eq!(c.advance(10), 10);
        assert_eq!(c.advance(15), 15);
        // Region recreated: starts from zero, counts on from there.
        assert_eq!(c.advance(0), 15);
        assert_eq!(c.advance(4), 19);
        // A tenant writes a huge value, then a small one, then huge again.
        assert_eq!(c.advance(u64::MAX), u64::MAX);
        assert_eq!(c.advance(1), u64::MAX);
        assert_eq!(c.advance(u64::MAX), u64::MAX, "saturates, never wraps");
        assert_eq!(c.total(), u64::MAX);
    }
}
