//! The control region: limits the agent sets and the container reads.
//!
//! The agent is the only writer. The limits are kept twice: the primary
//! fields (where readers of every version look) and a backup copy. A write
//! fills the backup under an odd `backup_epoch`, then the primary under an
//! odd `epoch`; each copy is a seqlock section. Since the writer is never
//! in both sections at once, a reader always finds one copy stable and
//! complete — the primary while the epoch is even, the backup while it is
//! odd — so it never returns a mix of two writes and never has to accept
//! one because a writer is slow, stopped or dead ([`ControlRegion::write`]).

use std::sync::atomic::{AtomicU32, Ordering, fence};

use crate::error::RegionError;
use crate::layout::{
    ABI_VERSION, CONTROL_MAGIC, CONTROL_SIZE, ControlGpu, ControlRegion, MAX_GPUS, UNLIMITED,
};

/// One GPU's limits as the agent sets them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuLimits {
    /// GPU UUID bytes.
    pub uuid: [u8; 16],
    /// Device memory the container may hold (bytes; [`UNLIMITED`]).
    pub memory_limit: u64,
    /// Memory charged per context (bytes).
    pub context_overhead: u64,
    /// Launch refill rate (warps/s; [`UNLIMITED`]; 0 pauses).
    pub launch_rate: u64,
    /// Launch burst (warps).
    pub launch_burst: u64,
    /// Least warps a kernel is charged (0: its warps; see
    /// [`crate::layout::ControlGpu::launch_floor`]).
    pub launch_floor: u64,
}

/// What a launch on one GPU reads of its limits, and the epoch it read
/// them under.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchLimits {
    /// Refill rate (warps/s; [`UNLIMITED`]; 0 pauses).
    pub rate: u64,
    /// Burst (warps).
    pub burst: u64,
    /// Least warps a kernel is charged.
    pub floor: u64,
    /// The control epoch they were read under.
    pub epoch: u64,
}

impl GpuLimits {
    /// No limits on `uuid`.
    pub fn unlimited(uuid: [u8; 16]) -> Self {
        Self {
            uuid,
            memory_limit: UNLIMITED,
            context_overhead: 0,
            launch_rate: UNLIMITED,
            launch_burst: 0,
            launch_floor: 0,
        }
    }
}

/// What the agent writes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ControlSpec {
    /// `FLAG_*` bits.
    pub flags: u32,
    /// The container's GPUs.
    pub gpus: Vec<GpuLimits>,
}

/// A consistent view of the control region.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ControlSnapshot {
    /// Epoch of this view (even).
    pub epoch: u64,
    /// Flags.
    pub flags: u32,
    /// The GPUs.
    pub gpus: Vec<GpuLimits>,
}

/// One copy of the limits: the primary fields or the backup.
#[derive(Clone, Copy)]
struct Fields<'a> {
    flags: &'a AtomicU32,
    gpu_count: &'a AtomicU32,
    gpus: &'a [ControlGpu; MAX_GPUS],
}

/// Counts the writer's stores, so a test can stop a write after any of
/// them (as a writer that is descheduled, stopped or killed would).
struct Stores(usize);

impl Stores {
    /// Whether the next store may run.
    fn next(&mut self) -> bool {
        match self.0.checked_sub(1) {
            Some(n) => {
                self.0 = n;
                true
            }
            None => false,
        }
    }
}

/// Runs `$store` if the writer's budget allows, else stops the write.
macro_rules! step {
    ($stores:expr, $store:expr) => {
        if !$stores.next() {
            return Ok(false);
        }
        $store;
    };
}

fn load_gpu(g: &ControlGpu) -> GpuLimits {
    let lo = g.uuid_lo.load(Ordering::Relaxed).to_le_bytes();
    let hi = g.uuid_hi.load(Ordering::Relaxed).to_le_bytes();
    let mut uuid = [0u8; 16];
    uuid[..8].copy_from_slice(&lo);
    uuid[8..].copy_from_slice(&hi);
    GpuLimits {
        uuid,
        memory_limit: g.memory_limit.load(Ordering::Relaxed),
        context_overhead: g.context_overhead.load(Ordering::Relaxed),
        launch_rate: g.launch_rate.load(Ordering::Relaxed),
        launch_burst: g.launch_burst.load(Ordering::Relaxed),
        launch_floor: g.launch_floor.load(Ordering::Relaxed),
    }
}

/// Stores `spec` into `to`; `Ok(false)` if `stores` ran out first.
fn store_copy(
    to: Fields<'_>,
    spec: &ControlSpec,
    stores: &mut Stores,
) -> Result<bool, RegionError> {
    step!(stores, to.flags.store(spec.flags, Ordering::Relaxed));
    step!(
        stores,
        to.gpu_count
            .store(spec.gpus.len() as u32, Ordering::Relaxed)
    );
    for (slot, g) in to.gpus.iter().zip(&spec.gpus) {
        let (lo, hi) = g.uuid.split_at(8);
        let word = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap_or([0; 8]));
        step!(stores, slot.uuid_lo.store(word(lo), Ordering::Relaxed));
        step!(stores, slot.uuid_hi.store(word(hi), Ordering::Relaxed));
        step!(
            stores,
            slot.memory_limit.store(g.memory_limit, Ordering::Relaxed)
        );
        step!(
            stores,
            slot.context_overhead
                .store(g.context_overhead, Ordering::Relaxed)
        );
        step!(
            stores,
            slot.launch_rate.store(g.launch_rate, Ordering::Relaxed)
        );
        step!(
            stores,
            slot.launch_burst.store(g.launch_burst, Ordering::Relaxed)
        );
        step!(
            stores,
            slot.launch_floor.store(g.launch_floor, Ordering::Relaxed)
        );
    }
    Ok(true)
}

/// Copies `from` into `to` (completing a write a dead writer left).
fn copy_copy(from: Fields<'_>, to: Fields<'_>, stores: &mut Stores) -> Result<bool, RegionError> {
    let n = (from.gpu_count.load(Ordering::Relaxed) as usize).min(MAX_GPUS);
    let spec = ControlSpec {
        flags: from.flags.load(Ordering::Relaxed),
        gpus: from.gpus[..n].iter().map(load_gpu).collect(),
    };
    store_copy(to, &spec, stores)
}

impl ControlRegion {
    fn primary(&self) -> Fields<'_> {
        Fields {
            flags: &self.header.flags,
            gpu_count: &self.header.gpu_count,
            gpus: &self.gpus,
        }
    }

    fn backup(&self) -> Fields<'_> {
        Fields {
            flags: &self.backup.header.flags,
            gpu_count: &self.backup.header.gpu_count,
            gpus: &self.backup.gpus,
        }
    }

    /// Writes the header of a fresh (zeroed) region.
    pub fn init(&mut self) {
        self.header.magic = CONTROL_MAGIC;
        self.header.abi_version = ABI_VERSION;
        self.header.size = CONTROL_SIZE as u32;
    }

    /// Checks magic, version and size.
    pub fn validate(&self, len: usize) -> Result<(), RegionError> {
        let h = &self.header;
        if h.magic != CONTROL_MAGIC {
            return Err(RegionError::field("control", "magic", "is not TSRCTL"));
        }
        if h.abi_version != ABI_VERSION {
            return Err(RegionError::field(
                "control",
                "abi_version",
                format!("is {}; this library speaks {ABI_VERSION}", h.abi_version),
            ));
        }
        if h.size as usize != CONTROL_SIZE || len < CONTROL_SIZE {
            return Err(RegionError::field(
                "control",
                "size",
                format!("is {} (file {len} bytes); expected {CONTROL_SIZE}", h.size),
            ));
        }
        Ok(())
    }

    /// Flags (readable even when the rest is unusable).
    pub fn flags(&self) -> u32 {
        self.header.flags.load(Ordering::Acquire)
    }

    /// The current epoch.
    #[inline]
    pub fn epoch(&self) -> u64 {
        self.header.epoch.load(Ordering::Acquire)
    }

    /// Runs `f` on a complete copy of the limits and returns its result and
    /// the epoch of that copy (even).
    ///
    /// While the primary fields are stable (even epoch, unchanged across
    /// the read) `f` reads them. While the writer is in the middle of them
    /// (odd epoch) it reads the backup, which the writer completed before
    /// it began on the primary and leaves alone until the primary is done;
    /// the view is labelled with the epoch that write publishes. So a writer
    /// stopped or dead at any store leaves a complete view to read, and no
    /// mixed view is ever returned. Waiting only happens while a running
    /// writer moves between the two copies, or on a file whose backup was
    /// never written (by a writer older than the backup) while its write
    /// is unfinished.
    fn read_section<T>(&self, mut f: impl FnMut(Fields<'_>) -> T) -> (T, u64) {
        let h = &self.header;
        let mut spins = 0u32;
        let mut start: Option<std::time::Instant> = None;
        loop {
            let e1 = h.epoch.load(Ordering::Acquire);
            if e1.is_multiple_of(2) {
                let v = f(self.primary());
                fence(Ordering::Acquire);
                if h.epoch.load(Ordering::Relaxed) == e1 {
                    return (v, e1);
                }
            } else {
                let b1 = h.backup_epoch.load(Ordering::Acquire);
                if b1 != 0 && b1.is_multiple_of(2) {
                    let v = f(self.backup());
                    fence(Ordering::Acquire);
                    let b2 = h.backup_epoch.load(Ordering::Relaxed);
                    let e2 = h.epoch.load(Ordering::Relaxed);
                    if b1 == b2 && e1 == e2 {
                        return (v, e1 + 1);
                    }
                }
            }
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else if start.get_or_insert_with(std::time::Instant::now).elapsed()
                < std::time::Duration::from_millis(10)
            {
                std::thread::yield_now();
            } else {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
    }

    /// GPU `i`'s limits and the epoch they were read under.
    pub fn gpu(&self, i: usize) -> (GpuLimits, u64) {
        self.read_section(|c| load_gpu(&c.gpus[i % MAX_GPUS]))
    }

    /// GPU `i`'s launch rate, burst and floor, and the epoch they were
    /// read under (the launch path: three fields, no UUID).
    pub fn launch_limits(&self, i: usize) -> LaunchLimits {
        let ((rate, burst, floor), epoch) = self.read_section(|c| {
            let g = &c.gpus[i % MAX_GPUS];
            (
                g.launch_rate.load(Ordering::Relaxed),
                g.launch_burst.load(Ordering::Relaxed),
                g.launch_floor.load(Ordering::Relaxed),
            )
        });
        LaunchLimits {
            rate,
            burst,
            floor,
            epoch,
        }
    }

    /// A consistent view of everything.
    pub fn snapshot(&self) -> ControlSnapshot {
        let ((flags, gpus), epoch) = self.read_section(|c| {
            let n = (c.gpu_count.load(Ordering::Relaxed) as usize).min(MAX_GPUS);
            (
                c.flags.load(Ordering::Relaxed),
                c.gpus[..n].iter().map(load_gpu).collect::<Vec<_>>(),
            )
        });
        ControlSnapshot { epoch, flags, gpus }
    }

    /// Publishes `spec` (agent side; one writer at a time).
    pub fn write(&self, spec: &ControlSpec) -> Result<(), RegionError> {
        self.write_stores(spec, &mut Stores(usize::MAX)).map(|_| ())
    }

    /// [`Self::write`], stopping after `stores` stores (and returning
    /// `Ok(false)`), as a writer stopped or killed there would.
    ///
    /// Order: (1) the backup, under an odd `backup_epoch`; (2) the primary
    /// fields, under an odd `epoch`. A write that finds the primary
    /// unfinished (its writer died in step 2) first completes it from the
    /// backup, so the backup stays what readers see until the primary
    /// holds the same.
    fn write_stores(&self, spec: &ControlSpec, stores: &mut Stores) -> Result<bool, RegionError> {
        if spec.gpus.len() > MAX_GPUS {
            return Err(RegionError::field(
                "control",
                "gpus",
                format!("has {} entries; at most {MAX_GPUS}", spec.gpus.len()),
            ));
        }
        let h = &self.header;
        let e = h.epoch.load(Ordering::Relaxed);
        let b = h.backup_epoch.load(Ordering::Relaxed);
        // Rewriting the same limits changes nothing (in particular not the
        // epoch, which launch buckets react to).
        if e.is_multiple_of(2) && b.is_multiple_of(2) && b != 0 {
            let cur = self.snapshot();
            if cur.flags == spec.flags && cur.gpus == spec.gpus {
                return Ok(true);
            }
        }
        let mut e = e;
        if !e.is_multiple_of(2) && b != 0 && b.is_multiple_of(2) {
            if !copy_copy(self.backup(), self.primary(), stores)? {
                return Ok(false);
            }
            step!(stores, h.epoch.store(e + 1, Ordering::Release));
            e += 1;
        }
        // (1) The backup. Readers use the primary meanwhile (if the epoch
        // is odd here, the file predates the backup: they wait).
        step!(stores, h.backup_epoch.store(b | 1, Ordering::Release));
        fence(Ordering::Release);
        if !store_copy(self.backup(), spec, stores)? {
            return Ok(false);
        }
        step!(stores, h.backup_epoch.store((b | 1) + 1, Ordering::Release));
        // (2) The primary. Readers use the backup meanwhile.
        step!(stores, h.epoch.store(e | 1, Ordering::Release));
        fence(Ordering::Release);
        if !store_copy(self.primary(), spec, stores)? {
            return Ok(false);
        }
        step!(stores, h.epoch.store((e | 1) + 1, Ordering::Release));
        Ok(true)
    }

    /// Index of the GPU with `uuid`.
    pub fn find(&self, uuid: &[u8; 16]) -> Option<usize> {
        self.snapshot().gpus.iter().position(|g| &g.uuid == uuid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn region() -> Box<ControlRegion> {
        // SAFETY: ControlRegion is made of integers and atomics, valid when
        // zeroed.
        let mut r = unsafe { Box::<ControlRegion>::new_zeroed().assume_init() };
        r.init();
        r
    }

    #[test]
    fn write_then_read() {
        let r = region();
        r.validate(CONTROL_SIZE).unwrap();
        let a = GpuLimits {
            uuid: [7; 16],
            memory_limit: 4 << 30,
            context_overhead: 300 << 20,
            launch_rate: 1000,
            launch_burst: 50,
            launch_floor: 8448,
        };
        let spec = ControlSpec {
            flags: 0,
            gpus: vec![a, GpuLimits::unlimited([9; 16])],
        };
        r.write(&spec).unwrap();
        let s = r.snapshot();
        assert_eq!(s.gpus, spec.gpus);
        assert_eq!(s.epoch, 2);
        assert_eq!(r.gpu(0).0, a);
        assert_eq!(r.find(&[9; 16]), Some(1));
        r.write(&spec).unwrap();
        assert_eq!(r.epoch(), 2, "the same limits again change nothing");
        let mut other = spec.clone();
        other.gpus[0].launch_rate = 2000;
        r.write(&other).unwrap();
        assert_eq!(r.epoch(), 4);
    }

    #[test]
    fn validation_names_the_field() {
        let mut r = region();
        r.header.abi_version = 99;
        let e = r.validate(CONTROL_SIZE).unwrap_err().to_string();
        assert!(e.contains("abi_version"), "{e}");
        let mut r = region();
        r.header.magic = *b"garbage!";
        assert!(
            r.validate(CONTROL_SIZE)
                .unwrap_err()
                .to_string()
                .contains("magic")
        );
        assert!(
            region()
                .validate(100)
                .unwrap_err()
                .to_string()
                .contains("size")
        );
    }

    #[test]
    fn a_dead_writer_does_not_hang_readers() {
        let r = region();
        r.write(&spec_of(1)).unwrap();
        // A writer that died in the primary section.
        r.header.epoch.store(r.epoch() + 1, Ordering::Relaxed);
        let t = std::time::Instant::now();
        assert_eq!(r.snapshot().gpus, spec_of(1).gpus);
        assert!(t.elapsed() < std::time::Duration::from_secs(1));
        // The next write completes the section.
        r.write(&ControlSpec::default()).unwrap();
        assert_eq!(r.epoch() % 2, 0);
        assert_eq!(r.snapshot().gpus, vec![]);
    }

    /// Limits derived from `k`, with a GPU count that changes with `k`, so
    /// any mix of two of them is told apart from both.
    fn spec_of(k: u64) -> ControlSpec {
        ControlSpec {
            flags: (k % 2) as u32,
            gpus: (0..1 + k % 3)
                .map(|i| GpuLimits {
                    uuid: [(k * 16 + i) as u8; 16],
                    memory_limit: k << 30 | i,
                    context_overhead: k << 20 | i,
                    launch_rate: k * 1000 + i,
                    launch_burst: k * 10 + i,
                    launch_floor: k * 7 + i,
                })
                .collect(),
        }
    }

    /// Which of `specs` the region shows, asserting it is exactly one of
    /// them through every reader.
    fn shown(r: &ControlRegion, specs: &[ControlSpec], what: &str) -> usize {
        let t = std::time::Instant::now();
        let s = r.snapshot();
        assert!(
            t.elapsed() < std::time::Duration::from_secs(1),
            "{what}: a stopped writer made the reader wait"
        );
        assert_eq!(s.epoch % 2, 0, "{what}");
        let i = specs
            .iter()
            .position(|p| p.flags == s.flags && p.gpus == s.gpus)
            .unwrap_or_else(|| panic!("{what}: a mixed view {s:?}"));
        for (g, want) in s.gpus.iter().enumerate() {
            assert_eq!(r.gpu(g).0, *want, "{what}");
            let l = r.launch_limits(g);
            assert_eq!(
                (l.rate, l.burst, l.floor),
                (want.launch_rate, want.launch_burst, want.launch_floor),
                "{what}"
            );
        }
        i
    }

    #[test]
    fn a_writer_stopped_after_any_store_leaves_a_complete_view() {
        let (a, b, c) = (spec_of(1), spec_of(2), spec_of(3));
        for k in 0.. {
            let r = region();
            r.write(&a).unwrap();
            let done = r.write_stores(&b, &mut Stores(k)).unwrap();
            let seen = shown(&r, &[a.clone(), b.clone()], &format!("stopped after {k}"));
            if done {
                assert_eq!(seen, 1, "a finished write shows");
                break;
            }
            // The next writer, itself stopped after any store, then let
            // finish: views stay whole, and the last write wins.
            for j in 0.. {
                let r2 = region();
                r2.write(&a).unwrap();
                r2.write_stores(&b, &mut Stores(k)).unwrap();
                let done2 = r2.write_stores(&c, &mut Stores(j)).unwrap();
                let what = format!("stopped after {k}, then {j}");
                let seen2 = shown(&r2, &[a.clone(), b.clone(), c.clone()], &what);
                assert!(seen2 >= seen, "{what}: went back to an older write");
                if done2 {
                    assert_eq!(seen2, 2, "{what}");
                    break;
                }
                r2.write(&c).unwrap();
                assert_eq!(shown(&r2, std::slice::from_ref(&c), &what), 0);
                assert_eq!(r2.epoch() % 2, 0, "{what}");
            }
        }
    }
}
