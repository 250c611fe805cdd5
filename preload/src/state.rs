//! The interposer's per-process state, set up on the first CUDA or NVML
//! call (a process that never makes one never touches the region).
//!
//! Modes:
//! - [`Mode::Enforce`]: the region is usable; limits apply.
//! - [`Mode::Refuse`]: the region is missing or invalid (the default, fail
//!   closed): GPU calls fail with `CUDA_ERROR_NOT_PERMITTED` /
//!   `NVML_ERROR_NO_PERMISSION`, and one line on stderr says why.
//! - [`Mode::PassThrough`]: the region is unusable but its control header
//!   carries the agent's `FLAG_FAIL_OPEN`: calls pass through unlimited,
//!   with a warning on stderr.
//!
//! A process's slot is never given back at exit. Its bytes stay charged
//! until a reclaimer (another process's allocation, or the agent) sees the
//! process dead: a process that is exiting still holds its device memory
//! until the driver frees it, and releasing earlier would let the
//! container exceed its limit for that moment (invariant I1).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

use tessera_region::error::RegionError;
use tessera_region::file::{CONTROL_FILE, Mapped, USAGE_FILE, open_control, open_usage};
use tessera_region::layout::{CONTROL_MAGIC, ControlRegion, FLAG_FAIL_OPEN, UsageRegion};

use crate::config::{self, ProcessEnv};
use crate::sys;

/// Devices (ordinals) the state caches facts for.
pub const MAX_ORDINALS: usize = 64;
/// How often an allocation looks for dead processes (ns).
pub const RECLAIM_INTERVAL_NS: u64 = 1_000_000_000;
const NO_SLOT: usize = usize::MAX;

/// What the library does in this process.
pub enum Mode {
    /// Limits apply.
    Enforce(Box<Enforcer>),
    /// Unlimited pass-through (fail-open policy).
    PassThrough,
    /// GPU use refused (fail closed); the reason.
    Refuse(String),
}

/// Bytes charged to the container for one object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Charge {
    /// Control-region GPU index.
    pub gpu: usize,
    /// Bytes.
    pub bytes: u64,
    /// Context the object belongs to and is freed with (0: none — pool
    /// and VMM memory outlive the context that allocated them).
    pub ctx: usize,
    /// Pool the bytes came from (0: none); a pool's charge is settled as a
    /// whole (see `hooks/pool.rs`).
    pub pool: usize,
}

/// A memory pool's account.
#[derive(Clone, Copy, Debug, Default)]
pub struct PoolBook {
    /// Control GPU index.
    pub gpu: usize,
    /// Bytes of live allocations from it.
    pub live: u64,
    /// Bytes charged for it: the larger of `live` and what the pool keeps
    /// reserved from the device.
    pub charged: u64,
}

/// A VMM physical allocation.
#[derive(Clone, Copy, Debug)]
pub struct Physical {
    /// Its charge.
    pub charge: Charge,
    /// Mappings referring to it.
    pub mappings: u32,
    /// Handle references: 1 from `cuMemCreate`, +1 per
    /// `cuMemRetainAllocationHandle`, −1 per `cuMemRelease`. The driver
    /// frees the memory when no reference and no mapping is left.
    pub refs: u32,
}

/// A primary context as the driver sees it.
#[derive(Clone, Copy, Debug)]
pub struct Primary {
    /// Handle.
    pub ctx: usize,
    /// Retain count.
    pub retains: u32,
    /// Its overhead charge.
    pub charge: Charge,
}

/// Every charged object of this process.
#[derive(Default)]
pub struct Books {
    /// Device pointers (managed, stream-ordered).
    pub allocs: HashMap<u64, Charge>,
    /// Linear and pitched allocations, charged by the pages they touch.
    pub pages: crate::pages::PageBook,
    /// Arrays and mipmapped arrays, by handle.
    pub arrays: HashMap<usize, Charge>,
    /// VMM physical allocations, by handle.
    pub physical: HashMap<u64, Physical>,
    /// VMM mappings: address → physical handle.
    pub mappings: BTreeMap<u64, u64>,
    /// Explicit contexts' overhead charges.
    pub contexts: HashMap<usize, Charge>,
    /// Primary contexts, by device ordinal.
    pub primary: HashMap<i32, Primary>,
    /// Memory pools → device ordinal (known pools).
    pub pool_devices: HashMap<usize, i32>,
    /// Memory pools' accounts.
    pub pools: HashMap<usize, PoolBook>,
    /// Executable graphs → launch cost.
    pub graphs: HashMap<usize, crate::hooks::GraphCost>,
}

/// Limits in force.
pub struct Enforcer {
    /// The control region (read-only mapping).
    pub control: Mapped<ControlRegion>,
    /// The usage region.
    pub usage: Mapped<UsageRegion>,
    /// Whether the container has exactly one GPU (launches then need no
    /// device lookup).
    pub single_gpu: bool,
    slot: AtomicUsize,
    pid: AtomicU32,
    start_time: AtomicU64,
    /// Ordinal → control GPU index + 1 (0 = not looked up, -1 = not
    /// assigned to this container).
    devices: [AtomicI32; MAX_ORDINALS],
    /// Ordinal → allocation granularity (0 = not looked up).
    granularity: [AtomicU64; MAX_ORDINALS],
    books: Mutex<Books>,
    registering: Mutex<()>,
    /// Serialises primary-context retain/release/reset bookkeeping.
    pub primary_ops: Mutex<()>,
}

static MODE: OnceLock<Mode> = OnceLock::new();

/// The mode, setting it up on first use.
pub fn mode() -> &'static Mode {
    MODE.get_or_init(|| {
        let dir = config::region_dir(&ProcessEnv, Path::new(config::CONTAINER_REGION_DIR));
        let m = setup(&dir);
        match &m {
            Mode::Refuse(why) => eprintln!("tessera: refusing GPU use: {why}"),
            Mode::PassThrough => eprintln!(
                "tessera: warning: the region in {} is unusable and policy is fail-open: GPU use is not limited",
                dir.display()
            ),
            Mode::Enforce(_) => sys::at_fork_child(forked),
        }
        m
    })
}

/// The enforcer, if limits apply.
pub fn enforcer() -> Option<&'static Enforcer> {
    match mode() {
        Mode::Enforce(e) => Some(e),
        _ => None,
    }
}

/// Sets up from region directory `dir`.
pub fn setup(dir: &Path) -> Mode {
    let control_path = dir.join(CONTROL_FILE);
    let control = match open_control(&control_path) {
        Ok(c) => c,
        Err(e) => {
            return Mode::Refuse(format!(
                "no usable control region at {} ({}); outside a Tessera container, set {} to a region directory",
                control_path.display(),
                chain(&e),
                config::ENV_REGION_DIR
            ));
        }
    };
    // The magic's first six bytes and the flags' offset are stable across
    // ABI versions, so a fail-open policy is honoured even then.
    let fail_open =
        control.header.magic[..6] == CONTROL_MAGIC[..6] && control.flags() & FLAG_FAIL_OPEN != 0;
    let unusable = |why: String| {
        if fail_open {
            Mode::PassThrough
        } else {
            Mode::Refuse(why)
        }
    };
    if let Err(e) = control.validate(control.mapped_len()) {
        return unusable(format!("{} is invalid: {e}", control_path.display()));
    }
    let usage_path = dir.join(USAGE_FILE);
    let usage = match open_usage(&usage_path) {
        Ok(u) => u,
        Err(e) => return unusable(chain(&e)),
    };
    let snapshot = control.snapshot();
    let e = Enforcer {
        single_gpu: snapshot.gpus.len() == 1,
        control,
        usage,
        slot: AtomicUsize::new(NO_SLOT),
        pid: AtomicU32::new(0),
        start_time: AtomicU64::new(0),
        devices: [const { AtomicI32::new(0) }; MAX_ORDINALS],
        granularity: [const { AtomicU64::new(0) }; MAX_ORDINALS],
        books: Mutex::new(Books::default()),
        registering: Mutex::new(()),
        primary_ops: Mutex::new(()),
    };
    if let Err(why) = e.register() {
        return Mode::Refuse(why);
    }
    Mode::Enforce(Box::new(e))
}

fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// Set once the real `cuInit` succeeded in this process under limits.
pub static CUDA_INITIALIZED: AtomicBool = AtomicBool::new(false);

/// Set in a child forked after CUDA was initialised. CUDA state does not
/// survive a fork (the driver refuses it), and neither do this library's
/// books: limited calls in the child fail with
/// `CUDA_ERROR_NOT_INITIALIZED` (see `hooks::dispatch`). A child that
/// execs starts afresh.
pub static FORKED: AtomicBool = AtomicBool::new(false);

/// Runs in the child after `fork` (async-signal-safe: atomics only). A
/// child of a process that never initialised CUDA (say, one that only
/// asked NVML) may use CUDA itself: it forgets the parent's slot and
/// claims its own on first use, so its bytes are its own.
unsafe extern "C" fn forked() {
    if CUDA_INITIALIZED.load(Ordering::Relaxed) {
        FORKED.store(true, Ordering::Relaxed);
    } else if let Some(Mode::Enforce(e)) = MODE.get() {
        e.slot.store(NO_SLOT, Ordering::Relaxed);
        e.pid.store(0, Ordering::Relaxed);
    }
}

/// Where device `ordinal`'s facts are cached, if it has a place.
fn cache_index(ordinal: i32) -> Option<usize> {
    usize::try_from(ordinal).ok().filter(|&i| i < MAX_ORDINALS)
}

impl Enforcer {
    /// Claims a process slot (reclaiming dead processes' if the table is
    /// full).
    fn register(&self) -> Result<usize, String> {
        let pid = sys::getpid();
        let start = sys::start_time(pid).unwrap_or(0);
        let slot = match self.usage.claim(pid, start) {
            Some(s) => s,
            None => {
                self.usage.reclaim_dead((pid, start), sys::alive);
                self.usage.claim(pid, start).ok_or_else(|| {
                    RegionError::Full {
                        path: self.usage.path().to_path_buf(),
                        slots: tessera_region::MAX_SLOTS,
                    }
                    .to_string()
                })?
            }
        };
        self.pid.store(pid, Ordering::Release);
        self.start_time.store(start, Ordering::Release);
        self.slot.store(slot, Ordering::Release);
        Ok(slot)
    }

    /// This process's slot, claiming one if needed (in a forked child, or
    /// if a reclaimer took ours).
    pub fn slot(&self) -> Result<usize, String> {
        let s = self.slot.load(Ordering::Acquire);
        if s != NO_SLOT && self.usage.owns(s, self.pid.load(Ordering::Relaxed)) {
            return Ok(s);
        }
        // One registration at a time, so racing threads claim one slot.
        let _one = self.registering.lock().unwrap_or_else(|p| p.into_inner());
        let s = self.slot.load(Ordering::Acquire);
        if s != NO_SLOT && self.usage.owns(s, self.pid.load(Ordering::Relaxed)) {
            return Ok(s);
        }
        self.register()
    }

    /// Slot for the launch fast path: one load unless unregistered.
    pub fn slot_fast(&self) -> Option<usize> {
        let s = self.slot.load(Ordering::Relaxed);
        if s != NO_SLOT {
            Some(s)
        } else {
            self.slot().ok()
        }
    }

    /// The charged-objects books.
    pub fn books(&self) -> MutexGuard<'_, Books> {
        self.books.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Cached control index of device `ordinal` (`Some(None)` = not
    /// assigned; `None` = not looked up yet).
    pub fn cached_device(&self, ordinal: i32) -> Option<Option<usize>> {
        match self.devices[cache_index(ordinal)?].load(Ordering::Acquire) {
            0 => None,
            -1 => Some(None),
            v => Some(Some(v as usize - 1)),
        }
    }

    /// Caches the control index of device `ordinal`.
    pub fn cache_device(&self, ordinal: i32, index: Option<usize>) {
        if let Some(i) = cache_index(ordinal) {
            self.devices[i].store(index.map_or(-1, |x| x as i32 + 1), Ordering::Release);
        }
    }

    /// Cached allocation granularity of device `ordinal`.
    pub fn cached_granularity(&self, ordinal: i32) -> Option<u64> {
        Some(self.granularity[cache_index(ordinal)?].load(Ordering::Acquire)).filter(|&g| g != 0)
    }

    /// Caches the allocation granularity of device `ordinal`.
    pub fn cache_granularity(&self, ordinal: i32, g: u64) {
        if let Some(i) = cache_index(ordinal) {
            self.granularity[i].store(g, Ordering::Release);
        }
    }

    /// Looks for dead processes if none looked in the last second (or, when
    /// `soon`, in the last 100 ms).
    pub fn maybe_reclaim(&self, soon: bool) {
        let now = sys::monotonic_ns();
        let interval = if soon {
            RECLAIM_INTERVAL_NS / 10
        } else {
            RECLAIM_INTERVAL_NS
        };
        if self.usage.reclaim_due(now, interval) {
            self.reclaim_now();
        }
    }

    /// Looks for dead processes now (an allocation is about to be refused).
    pub fn reclaim_now(&self) {
        let me = (
            self.pid.load(Ordering::Acquire),
            self.start_time.load(Ordering::Acquire),
        );
        self.usage.reclaim_dead(me, sys::alive);
    }
}
