//! What linear device memory really costs: the device pages its
//! allocations touch.
//!
//! The driver packs small `cuMemAlloc` / `cuMemAllocPitch` allocations
//! into shared pages and starts larger ones on a page boundary (the facts
//! and their sources are in the simulator's `gpusim_cuda::heap`, which
//! models them); a page is held while any allocation lives in it. So the
//! container is charged per page, judged by the addresses the driver
//! returned: an allocation `[addr, addr + len)` touches pages
//! `addr / page ..= (addr + len - 1) / page`. Its interior pages are its
//! own; its first and last page may be shared with its neighbours, so
//! those carry a reference count and are charged while any live
//! allocation touches them.
//!
//! Invariant: the bytes charged for the book are exactly `page ×` the
//! number of distinct pages touched by live allocations (and by frees in
//! flight, until the driver's free returned) — never less than
//! the driver holds, however sizes and frees are chosen (a tenant that
//! keeps one small allocation alive per page pays for every such page).

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};

/// Unit of the driver's packing of small allocations (cupy#176): a
/// footprint is counted from its 512-byte-aligned start to its 512-byte-
/// aligned end.
pub const UNIT: u64 = 512;

/// A live linear allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    /// Length in bytes (at least 1).
    pub len: u64,
    /// Page size of its device (a power of two, at least [`UNIT`]).
    pub page: u64,
    /// Control-region GPU index it is charged to.
    pub gpu: usize,
    /// Context it belongs to and dies with.
    pub ctx: usize,
}

impl Span {
    /// Its footprint `[start, end)` in whole units.
    fn footprint(&self, addr: u64) -> (u64, u64) {
        let start = addr / UNIT * UNIT;
        let end = addr
            .saturating_add(self.len.max(1))
            .div_ceil(UNIT)
            .saturating_mul(UNIT);
        (start, end)
    }

    /// First and last page number touched at `addr`.
    fn pages(&self, addr: u64) -> (u64, u64) {
        let (start, end) = self.footprint(addr);
        (start / self.page, (end - 1) / self.page)
    }

    /// Bytes of its footprint inside page number `n`.
    fn within(&self, addr: u64, n: u64) -> u64 {
        let (start, end) = self.footprint(addr);
        let lo = n * self.page;
        end.min(lo + self.page).saturating_sub(start.max(lo))
    }
}

/// A first or last page of live allocations.
#[derive(Clone, Copy, Debug)]
struct Page {
    /// Live allocations with it as their first or last page.
    refs: u32,
    /// Bytes of their footprints inside it.
    used: u64,
    /// Their context, or `None` once two contexts share it (the driver
    /// places a context's small allocations in that context's pages only).
    ctx: Option<usize>,
}

/// The pages held by this process's linear allocations.
#[derive(Default, Debug)]
pub struct PageBook {
    /// Live allocations by address.
    spans: BTreeMap<u64, Span>,
    /// (GPU, page number) of first and last pages.
    shared: HashMap<(usize, u64), Page, BuildHasherDefault<PageHash>>,
}

/// A multiply-rotate hash for page keys: on every allocation and free, so
/// cheaper than the default SipHash; keys are the process's own page
/// numbers, so a collision-seeking tenant only slows itself.
#[derive(Default)]
struct PageHash(u64);

impl Hasher for PageHash {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x517c_c1b7_2722_0a95);
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
}

/// The first and (if another) the last page of a span.
fn ends(first: u64, last: u64) -> impl Iterator<Item = u64> {
    [first, last]
        .into_iter()
        .take(if first == last { 1 } else { 2 })
}

/// Worst-case bytes a request of `len` bytes makes the driver hold on
/// pages of `page` bytes, as reserved before the real call: a small
/// request (at most half a page) may open a fresh page; a larger one
/// starts on a page boundary.
pub fn expected(len: u64, page: u64) -> u64 {
    if is_small(len, page) {
        page
    } else {
        len.div_ceil(page).saturating_mul(page)
    }
}

/// Whether the driver packs a request of `len` bytes into shared pages.
pub fn is_small(len: u64, page: u64) -> bool {
    len <= page / 2
}

impl PageBook {
    /// Bytes newly held if `span` is added at `addr`.
    pub fn cost(&self, addr: u64, span: &Span) -> u64 {
        let (first, last) = span.pages(addr);
        let mut pages = last.saturating_sub(first).saturating_sub(1);
        if !self.shared.contains_key(&(span.gpu, first)) {
            pages += 1;
        }
        if last != first && !self.shared.contains_key(&(span.gpu, last)) {
            pages += 1;
        }
        pages.saturating_mul(span.page)
    }

    /// Adds a live allocation; returns the bytes it newly holds. The
    /// address must not be booked: callers [`remove`](Self::remove) a
    /// stale entry first, to give its bytes back (one left in place would
    /// only stay charged).
    pub fn add(&mut self, addr: u64, span: Span) -> u64 {
        let cost = self.cost(addr, &span);
        let (first, last) = span.pages(addr);
        for n in ends(first, last) {
            let p = self.shared.entry((span.gpu, n)).or_insert(Page {
                refs: 0,
                used: 0,
                ctx: Some(span.ctx),
            });
            p.refs += 1;
            p.used += span.within(addr, n);
            if p.ctx != Some(span.ctx) {
                p.ctx = None;
            }
        }
        self.spans.insert(addr, span);
        cost
    }

    /// Removes the allocation at `addr`; returns it and the bytes no
    /// longer held.
    pub fn remove(&mut self, addr: u64) -> Option<(Span, u64)> {
        let span = self.take(addr)?;
        Some((span, self.release(addr, &span)))
    }

    /// Takes the allocation at `addr` out of the book while its pages stay
    /// held (a free in flight: a racing free of the same address finds
    /// nothing, and the pages are not given up before the driver's free
    /// succeeded). Follow with [`release`](Self::release) or
    /// [`restore`](Self::restore).
    pub fn take(&mut self, addr: u64) -> Option<Span> {
        self.spans.remove(&addr)
    }

    /// Puts back an allocation [`take`](Self::take)n whose free failed.
    pub fn restore(&mut self, addr: u64, span: Span) {
        self.spans.insert(addr, span);
    }

    /// Gives up the pages of a [`take`](Self::take)n allocation; returns
    /// the bytes no longer held.
    pub fn release(&mut self, addr: u64, span: &Span) -> u64 {
        let (first, last) = span.pages(addr);
        let mut pages = last.saturating_sub(first).saturating_sub(1);
        for n in ends(first, last) {
            let key = (span.gpu, n);
            if let Some(p) = self.shared.get_mut(&key) {
                p.refs -= 1;
                p.used = p.used.saturating_sub(span.within(addr, n));
                if p.refs == 0 {
                    self.shared.remove(&key);
                    pages += 1;
                }
            }
        }
        pages.saturating_mul(span.page)
    }

    /// Whether a small request of `len` bytes fits in a page already held
    /// for context `ctx` on GPU `gpu` (pages of `page` bytes): a free run
    /// of whole units that long between the footprints in it, where the
    /// driver's first fit puts it instead of opening a page.
    pub fn has_room(&self, gpu: usize, ctx: usize, page: u64, len: u64) -> bool {
        let want = len.max(1).div_ceil(UNIT) * UNIT;
        self.shared
            .iter()
            .filter(|&(&(g, _), p)| {
                g == gpu && p.ctx == Some(ctx) && page.saturating_sub(p.used) >= want
            })
            .any(|(&(_, n), _)| self.gap_in(n * page, page, want))
    }

    /// Whether page `[lo, lo + page)` has a free run of `want` bytes.
    fn gap_in(&self, lo: u64, page: u64, want: u64) -> bool {
        let hi = lo + page;
        let mut cursor = lo;
        // A footprint that starts before the page may reach into it.
        if let Some((&a, s)) = self.spans.range(..lo).next_back() {
            cursor = cursor.max(s.footprint(a).1);
        }
        for (&a, s) in self.spans.range(lo..hi) {
            let (start, end) = s.footprint(a);
            if start >= cursor && start - cursor >= want {
                return true;
            }
            cursor = cursor.max(end);
        }
        cursor < hi && hi - cursor >= want
    }

    /// The allocation at `addr`, if booked.
    pub fn get(&self, addr: u64) -> Option<Span> {
        self.spans.get(&addr).copied()
    }

    /// Takes every allocation of context `ctx` out of the book, pages
    /// still held, for a context destroy in flight: follow with
    /// [`release`](Self::release) for each once the destroy succeeded, or
    /// [`restore`](Self::restore) if it failed. Taken before the destroy,
    /// so a new context that gets the same handle meanwhile books its own
    /// allocations apart from these.
    pub fn take_context(&mut self, ctx: usize) -> Vec<(u64, Span)> {
        let addrs: Vec<u64> = self
            .spans
            .iter()
            .filter(|(_, s)| s.ctx == ctx)
            .map(|(&a, _)| a)
            .collect();
        addrs
            .into_iter()
            .filter_map(|a| self.take(a).map(|s| (a, s)))
            .collect()
    }

    /// Bytes held on GPU `gpu`: `page ×` distinct pages touched.
    pub fn held(&self, gpu: usize) -> u64 {
        let mut pages = std::collections::HashSet::new();
        let mut bytes = 0;
        for (&addr, s) in self.spans.iter().filter(|(_, s)| s.gpu == gpu) {
            let (first, last) = s.pages(addr);
            for p in [first, last] {
                if pages.insert(p) {
                    bytes += s.page;
                }
            }
            bytes += last.saturating_sub(first).saturating_sub(1) * s.page;
        }
        bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: u64 = 2 << 20;

    fn span(len: u64) -> Span {
        Span {
            len,
            page: PAGE,
            gpu: 0,
            ctx: 1,
        }
    }

    /// A small xorshift, so the property below runs on many layouts.
    fn rng(seed: &mut u64) -> u64 {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        *seed
    }

    #[test]
    fn pages_are_charged_once_and_returned_with_their_last_allocation() {
        let mut b = PageBook::default();
        // Two 512-byte allocations in one page: one page.
        assert_eq!(b.add(0x1000_0000, span(512)), PAGE);
        assert_eq!(b.add(0x1000_0200, span(512)), 0);
        // A 3 MiB allocation from a page boundary: two pages; a small
        // allocation in the tail of its last page costs nothing.
        assert_eq!(b.add(0x2000_0000, span(3 << 20)), 2 * PAGE);
        assert_eq!(b.add(0x2000_0000 + (3 << 20), span(4096)), 0);
        // The large one goes; its last page stays for the small one.
        assert_eq!(b.remove(0x2000_0000).map(|x| x.1), Some(PAGE));
        assert_eq!(b.remove(0x2000_0000 + (3 << 20)).map(|x| x.1), Some(PAGE));
        assert_eq!(b.remove(0x1000_0000).map(|x| x.1), Some(0));
        assert_eq!(b.remove(0x1000_0200).map(|x| x.1), Some(PAGE));
        assert_eq!(b.remove(0x1000_0200), None, "a double free books nothing");
        // An allocation straddling a boundary holds both pages.
        assert_eq!(b.add(PAGE - 256, span(512)), 2 * PAGE);
        assert_eq!(b.held(0), 2 * PAGE);
        let taken = b.take_context(1);
        assert_eq!(taken.len(), 1);
        let (addr, s) = taken[0];
        assert_eq!(b.release(addr, &s), 2 * PAGE);
        assert_eq!(b.held(0), 0);
    }

    #[test]
    fn the_charge_always_equals_the_distinct_pages_touched() {
        // Random layouts (overlap-free, unaligned, any size) and random
        // frees: what add/remove report always sums to `held`.
        let mut seed = 0x9e37_79b9_7f4a_7c15;
        let mut b = PageBook::default();
        let mut live: Vec<u64> = Vec::new();
        let mut next = 0x4000_0000u64;
        let mut charged = 0u64;
        for step in 0..6_000u32 {
            if live.is_empty() || !rng(&mut seed).is_multiple_of(3) {
                let len = match rng(&mut seed) % 4 {
                    0 => 1 + rng(&mut seed) % 4096,
                    1 => 1 + rng(&mut seed) % (1 << 20),
                    2 => 1 + rng(&mut seed) % (8 << 20),
                    _ => 512,
                };
                let addr = next + (rng(&mut seed) % 4) * 256;
                next = addr + len;
                charged += b.add(addr, span(len));
                live.push(addr);
            } else {
                let i = (rng(&mut seed) as usize) % live.len();
                let addr = live.swap_remove(i);
                charged -= b.remove(addr).map(|x| x.1).unwrap();
            }
            if step.is_multiple_of(64) {
                assert_eq!(charged, b.held(0));
            }
        }
        assert_eq!(charged, b.held(0));
        for addr in live {
            charged -= b.remove(addr).map(|x| x.1).unwrap();
        }
        assert_eq!((charged, b.held(0)), (0, 0));
    }

    #[test]
    fn room_is_a_free_run_in_a_page_of_the_same_context() {
        let mut b = PageBook::default();
        let base = 0x4000_0000;
        // A full page of 1 MiB pairs: no room.
        b.add(base, span(1 << 20));
        b.add(base + (1 << 20), span(1 << 20));
        assert!(!b.has_room(0, 1, PAGE, 1));
        // Free the first: a 1 MiB run (footprints count whole units).
        b.remove(base);
        assert!(b.has_room(0, 1, PAGE, 1 << 20));
        assert!(!b.has_room(0, 1, PAGE, (1 << 20) + 1));
        assert!(!b.has_room(0, 2, PAGE, 1), "another context's page");
        assert!(!b.has_room(1, 1, PAGE, 1), "another GPU's page");
        // A 3 MiB allocation leaves 1 MiB in its last page; 1000 bytes
        // there take 1024.
        b.add(base + 4 * PAGE, span(3 << 20));
        b.remove(base + (1 << 20));
        assert!(b.has_room(0, 1, PAGE, 1 << 20));
        b.add(base + 4 * PAGE + (3 << 20), span(1000));
        assert!(b.has_room(0, 1, PAGE, (1 << 20) - 1024));
        assert!(!b.has_room(0, 1, PAGE, (1 << 20) - 512));
        // Scattered units with total room but no run of 1024.
        let mut b = PageBook::default();
        for i in 0..(PAGE / 512) {
            if i.is_multiple_of(2) {
                b.add(base + i * 512, span(512));
            }
        }
        assert!(b.has_room(0, 1, PAGE, 512));
        assert!(!b.has_room(0, 1, PAGE, 513));
    }

    #[test]
    fn reservations_cover_one_fresh_page_or_whole_pages() {
        assert_eq!(expected(1, PAGE), PAGE);
        assert_eq!(expected(1 << 20, PAGE), PAGE);
        assert_eq!(expected((1 << 20) + 1, PAGE), PAGE);
        assert_eq!(expected(7 << 20, PAGE), 8 << 20);
        assert_eq!(expected(PAGE, PAGE), PAGE);
    }
}
