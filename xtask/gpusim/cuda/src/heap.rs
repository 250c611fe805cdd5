//! Where the driver puts linear device memory (`cuMemAlloc`,
//! `cuMemAllocPitch`) and which device pages it holds for it.
//!
//! Facts behind the model (public measurements and documentation):
//! - CuPy measured (cupy/cupy#176, 2017, Tesla K80 and GTX TITAN X) that
//!   consecutive small `cudaMalloc` results lie 512 bytes apart: the
//!   driver packs small allocations into shared memory in 512-byte units.
//! - PyTorch's allocator change for Pascal and later (pytorch/pytorch#17120,
//!   2019) records that the driver's page grew from 1 MiB to 2 MiB, that an
//!   allocation larger than 1 MiB always starts on a page boundary, that
//!   the rest of such an allocation's last page can only be filled by small
//!   allocations, and that nvidia-smi counts a partly used page as used.
//! - PyTorch's CUDACachingAllocator is sized after that behaviour: 512-byte
//!   minimum blocks, requests up to 1 MiB packed into 2 MiB segments, large
//!   segments rounded to 2 MiB.
//! - The CUDA C++ Programming Guide guarantees at least 256-byte alignment
//!   for every allocation result; the VMM API (`cuMemCreate`) takes whole
//!   multiples of `cuMemGetAllocationGranularity`, 2 MiB on current GPUs.
//!
//! The model, per context, with the node's allocation granularity as the
//! page (2 MiB by default):
//! - A request of at most half a page (1 MiB) is *small*: it is rounded up
//!   to [`SMALL_UNIT`] bytes and placed first-fit in the context's lowest
//!   page with room — a page of small allocations, or the unused tail of a
//!   large allocation's last page. Only when none has room is a fresh page
//!   taken and charged.
//! - A larger request starts on a page boundary and is charged whole pages.
//! - A page is charged (to the process's channel, what NVML reports) while
//!   any allocation lives in it, and given back with its last one.
//!
//! Invariant: every page with a live allocation in it is charged exactly
//! once — by the large allocation whose pages they are, or (for a page of
//! small allocations, or a tail page that outlived its large allocation) by
//! the page's own [`Page::charge`].

use std::collections::{BTreeMap, BTreeSet, HashMap};

use gpusim::Attachment;

use crate::charge::Charge;
use crate::process::Process;
use crate::status::*;
use crate::va::AddressSpace;

/// Unit and alignment of small allocations inside a page.
pub const SMALL_UNIT: u64 = 512;

/// Pages of one context that small allocations may use.
#[derive(Default)]
pub struct Heap {
    /// Page address → page.
    pages: BTreeMap<u64, Page>,
    /// Pages with at least one free unit, in address order (first fit
    /// goes low; full pages are not visited).
    open: BTreeSet<u64>,
}

impl Heap {
    /// Records whether page `base` has room left.
    fn update(&mut self, base: u64) {
        match self.pages.get(&base) {
            Some(pg) if pg.free > 0 => self.open.insert(base),
            _ => self.open.remove(&base),
        };
    }
}

/// A page open to small allocations.
struct Page {
    /// Free ranges: offset → length, disjoint and coalesced.
    gaps: BTreeMap<u64, u64>,
    /// Sum of `gaps`.
    free: u64,
    /// Small allocations living in it.
    live: u32,
    /// The page's own charge; `None` while the large allocation whose last
    /// page it is still covers it.
    charge: Option<Charge>,
    /// Base of the large allocation whose last page it is, while it lives.
    large: Option<u64>,
}

impl Page {
    fn new(page: u64, used: u64, charge: Option<Charge>, large: Option<u64>) -> Self {
        let mut gaps = BTreeMap::new();
        if used < page {
            gaps.insert(used, page - used);
        }
        Self {
            gaps,
            free: page - used,
            live: 0,
            charge,
            large,
        }
    }

    /// First-fit: takes `len` bytes and returns their offset.
    fn take(&mut self, len: u64) -> Option<u64> {
        if self.free < len {
            return None;
        }
        let (&off, &gap) = self.gaps.iter().find(|&(_, &g)| g >= len)?;
        self.gaps.remove(&off);
        if gap > len {
            self.gaps.insert(off + len, gap - len);
        }
        self.free -= len;
        Some(off)
    }

    /// Gives `[off, off + len)` back, merging it with its neighbours.
    fn give(&mut self, off: u64, len: u64) {
        let mut start = off;
        let mut end = off + len;
        if let Some((&p, &l)) = self.gaps.range(..off).next_back()
            && p + l == off
        {
            self.gaps.remove(&p);
            start = p;
        }
        if let Some(l) = self.gaps.remove(&end) {
            end += l;
        }
        self.gaps.insert(start, end - start);
        self.free += len;
    }

    fn empty(&self) -> bool {
        self.live == 0 && self.large.is_none()
    }
}

/// The heaps of every context.
#[derive(Default)]
pub struct Heaps {
    by_context: HashMap<u64, Heap>,
}

/// Rounds a small request to whole units.
fn small_len(size: u64) -> u64 {
    size.max(1).div_ceil(SMALL_UNIT) * SMALL_UNIT
}

impl Heaps {
    /// Whether a request of `size` bytes is small on pages of `page` bytes.
    pub fn is_small(size: u64, page: u64) -> bool {
        size <= page / 2
    }

    /// Places `size` bytes for context `ctx` (channel `att`) and charges
    /// what the placement newly holds: returns the address and the
    /// allocation's own charge ([`Charge::none`] for a small allocation,
    /// whose page is charged by the page). Nothing is held on failure.
    pub fn alloc(
        &mut self,
        p: &Process,
        va: &mut AddressSpace,
        ctx: u64,
        att: &Attachment,
        size: u64,
    ) -> Result<(u64, Charge), CUresult> {
        let page = p.page_size();
        let heap = self.by_context.entry(ctx).or_default();
        if Self::is_small(size, page) {
            let len = small_len(size);
            let mut found = None;
            for &base in &heap.open {
                if let Some(pg) = heap.pages.get_mut(&base)
                    && let Some(off) = pg.take(len)
                {
                    pg.live += 1;
                    found = Some((base, off));
                    break;
                }
            }
            if let Some((base, off)) = found {
                heap.update(base);
                return Ok((base + off, Charge::none(*att)));
            }
            let charge = p.charge(att, page)?;
            let Some(base) = va.alloc(page, page) else {
                let _ = p.uncharge(&charge);
                return Err(CUDA_ERROR_OUT_OF_MEMORY);
            };
            let mut pg = Page::new(page, 0, Some(charge), None);
            let off = pg.take(len).ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
            pg.live = 1;
            heap.pages.insert(base, pg);
            heap.update(base);
            return Ok((base + off, Charge::none(*att)));
        }
        let pages = size.div_ceil(page);
        let bytes = pages.checked_mul(page).ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
        let charge = p.charge(att, bytes)?;
        let Some(base) = va.alloc(bytes, page) else {
            let _ = p.uncharge(&charge);
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        };
        // The tail of the last page stays open to small allocations.
        let used = small_len(size) - (pages - 1) * page;
        if used < page {
            let tail = base + bytes - page;
            heap.pages
                .insert(tail, Page::new(page, used, None, Some(base)));
            heap.update(tail);
        }
        Ok((base, charge))
    }

    /// Frees the allocation of `size` bytes at `dptr` made by
    /// [`alloc`](Self::alloc) for `ctx` with own charge `charge`, giving
    /// back every page no allocation lives in any more. Everything is
    /// undone even if the simulator cannot take a charge back; that error
    /// is returned.
    pub fn free(
        &mut self,
        p: &Process,
        va: &mut AddressSpace,
        ctx: u64,
        dptr: u64,
        size: u64,
        mut charge: Charge,
    ) -> Result<(), CUresult> {
        let page = p.page_size();
        let Some(heap) = self.by_context.get_mut(&ctx) else {
            return p.uncharge(&charge);
        };
        let result = if Self::is_small(size, page) {
            let base = dptr & !(page - 1);
            let Some(pg) = heap.pages.get_mut(&base) else {
                return Err(CUDA_ERROR_INVALID_VALUE);
            };
            pg.give(dptr - base, small_len(size));
            pg.live = pg.live.saturating_sub(1);
            if pg.empty() {
                let pg = heap.pages.remove(&base);
                heap.update(base);
                va.free(base, page);
                match pg.and_then(|pg| pg.charge) {
                    Some(c) => p.uncharge(&c),
                    None => Ok(()),
                }
            } else {
                heap.update(base);
                Ok(())
            }
        } else {
            let pages = size.div_ceil(page);
            let tail = dptr + (pages - 1) * page;
            match heap.pages.get_mut(&tail) {
                Some(pg) if pg.large == Some(dptr) && pg.live > 0 => {
                    // Small allocations still live in the last page: it
                    // keeps one page of the charge; the rest goes back.
                    pg.large = None;
                    pg.give(0, small_len(size) - (pages - 1) * page);
                    let r = p.uncharge_part(&mut charge, (pages - 1) * page);
                    pg.charge = Some(charge);
                    heap.update(tail);
                    if pages > 1 {
                        va.free(dptr, (pages - 1) * page);
                    }
                    r
                }
                _ => {
                    if heap
                        .pages
                        .get(&tail)
                        .is_some_and(|pg| pg.large == Some(dptr))
                    {
                        heap.pages.remove(&tail);
                        heap.update(tail);
                    }
                    va.free(dptr, pages * page);
                    p.uncharge(&charge)
                }
            }
        };
        if heap.pages.is_empty() {
            self.by_context.remove(&ctx);
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_fit_first_and_merge_freed_runs() {
        let mut pg = Page::new(4096, 1024, None, None);
        assert_eq!(pg.take(1024), Some(1024));
        assert_eq!(pg.take(1024), Some(2048));
        assert_eq!(pg.take(1024), Some(3072));
        assert_eq!(pg.take(512), None, "full");
        pg.give(1024, 1024);
        pg.give(3072, 1024);
        assert_eq!(pg.take(2048), None, "two runs of 1024, none of 2048");
        pg.give(2048, 1024);
        assert_eq!(pg.gaps.len(), 1, "merged: {:?}", pg.gaps);
        assert_eq!(pg.take(3072), Some(1024));
        assert_eq!(pg.free, 0);
    }
}
