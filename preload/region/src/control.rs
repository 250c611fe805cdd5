//! The control region: limits the agent sets and the container reads.
//!
//! The agent is the only writer. A write is a seqlock section: the epoch is
//! made odd, the fields are stored, the epoch is made even again; readers
//! retry while the epoch is odd or changed under them. Every field is an
//! atomic, so a torn read can only mix whole old and new values.

use std::sync::atomic::{Ordering, fence};

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

/// An odd epoch this process already waited out (a writer died mid-write).
static STUCK_EPOCH: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

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
    }
}

impl ControlRegion {
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
    pub fn epoch(&self) -> u64 {
        self.header.epoch.load(Ordering::Acquire)
    }

    /// Runs `f` as a seqlock read section and returns its result and the
    /// epoch it saw. Gives up waiting for an unfinished write (a writer that
    /// died) after about 10 ms and returns what it read; later reads under
    /// the same stuck epoch do not wait again.
    fn read_section<T>(&self, mut f: impl FnMut() -> T) -> (T, u64) {
        let epoch = &self.header.epoch;
        let mut start: Option<std::time::Instant> = None;
        let mut spins = 0u32;
        loop {
            let e1 = epoch.load(Ordering::Acquire);
            let v = f();
            fence(Ordering::Acquire);
            let e2 = epoch.load(Ordering::Relaxed);
            if e1 == e2 && (e1.is_multiple_of(2) || STUCK_EPOCH.load(Ordering::Relaxed) == e1) {
                return (v, e1 & !1);
            }
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else if start.get_or_insert_with(std::time::Instant::now).elapsed()
                < std::time::Duration::from_millis(10)
            {
                std::thread::yield_now();
            } else {
                STUCK_EPOCH.store(e2, Ordering::Relaxed);
                return (v, e2 & !1);
            }
        }
    }

    /// GPU `i`'s limits and the epoch they were read under.
    pub fn gpu(&self, i: usize) -> (GpuLimits, u64) {
        let g = &self.gpus[i % MAX_GPUS];
        self.read_section(|| load_gpu(g))
    }

    /// GPU `i`'s launch rate and burst, and the epoch they were read under
    /// (the launch fast path: two fields, no UUID).
    pub fn launch_limits(&self, i: usize) -> (u64, u64, u64) {
        let g = &self.gpus[i % MAX_GPUS];
        let ((rate, burst), epoch) = self.read_section(|| {
            (
                g.launch_rate.load(Ordering::Relaxed),
                g.launch_burst.load(Ordering::Relaxed),
            )
        });
        (rate, burst, epoch)
    }

    /// A consistent view of everything.
    pub fn snapshot(&self) -> ControlSnapshot {
        let ((flags, gpus), epoch) = self.read_section(|| {
            let n = (self.header.gpu_count.load(Ordering::Relaxed) as usize).min(MAX_GPUS);
            (
                self.header.flags.load(Ordering::Relaxed),
                self.gpus[..n].iter().map(load_gpu).collect::<Vec<_>>(),
            )
        });
        ControlSnapshot { epoch, flags, gpus }
    }

    /// Publishes `spec` (agent side; one writer at a time).
    pub fn write(&self, spec: &ControlSpec) -> Result<(), RegionError> {
        if spec.gpus.len() > MAX_GPUS {
            return Err(RegionError::field(
                "control",
                "gpus",
                format!("has {} entries; at most {MAX_GPUS}", spec.gpus.len()),
            ));
        }
        let h = &self.header;
        let e = h.epoch.load(Ordering::Relaxed);
        // Rewriting the same limits changes nothing (in particular not the
        // epoch, which launch buckets react to).
        if e.is_multiple_of(2) {
            let cur = self.snapshot();
            if cur.flags == spec.flags && cur.gpus == spec.gpus {
                return Ok(());
            }
        }
        // An odd epoch left by a writer that died is completed first.
        h.epoch.store(e | 1, Ordering::Relaxed);
        fence(Ordering::Release);
        h.flags.store(spec.flags, Ordering::Relaxed);
        h.gpu_count.store(spec.gpus.len() as u32, Ordering::Relaxed);
        for (slot, g) in self.gpus.iter().zip(&spec.gpus) {
            let (lo, hi) = g.uuid.split_at(8);
            slot.uuid_lo.store(
                u64::from_le_bytes(lo.try_into().unwrap_or([0; 8])),
                Ordering::Relaxed,
            );
            slot.uuid_hi.store(
                u64::from_le_bytes(hi.try_into().unwrap_or([0; 8])),
                Ordering::Relaxed,
            );
            slot.memory_limit.store(g.memory_limit, Ordering::Relaxed);
            slot.context_overhead
                .store(g.context_overhead, Ordering::Relaxed);
            slot.launch_rate.store(g.launch_rate, Ordering::Relaxed);
            slot.launch_burst.store(g.launch_burst, Ordering::Relaxed);
        }
        h.epoch.store((e | 1) + 1, Ordering::Release);
        Ok(())
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
        r.header.epoch.store(7, Ordering::Relaxed);
        let t = std::time::Instant::now();
        let _ = r.snapshot();
        assert!(t.elapsed() < std::time::Duration::from_secs(1));
        // The next write completes the section.
        r.write(&ControlSpec::default()).unwrap();
        assert_eq!(r.epoch() % 2, 0);
    }
}
