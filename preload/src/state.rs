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
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use tessera_region::error::RegionError;
use tessera_region::file::{CONTROL_FILE, Mapped, USAGE_FILE, open_control, open_usage};
use tessera_region::layout::{CONTROL_MAGIC, ControlRegion, FLAG_FAIL_OPEN, UsageRegion, start};
use tessera_region::usage::Claim;

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
    /// Destroyed: the charge stays until nothing is live (`hooks/pool.rs`).
    pub destroyed: bool,
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
    /// The control epoch (even) under which the container had exactly one
    /// GPU, or that epoch | 1 if it had another number; any other value
    /// (initially `u64::MAX`): count again.
    single: AtomicU64,
    slot: AtomicUsize,
    /// The owner word of this process's claim on `slot` (generation
    /// included, so a reclaimed and re-claimed slot is not taken for ours).
    owner: AtomicU64,
    pid: AtomicU32,
    start_time: AtomicU64,
    /// Ordinal → control GPU index, valid under one control epoch:
    /// `epoch << 8 | tag`, tag 0 = not looked up, [`NOT_ASSIGNED`] = not
    /// the container's, else index + 1. An entry made under another epoch
    /// is looked up again: the agent may have changed the GPU set.
    devices: [AtomicU64; MAX_ORDINALS],
    /// Ordinal → the device's UUID (fixed for the process's life), once
    /// `uuid_known`.
    uuids: [[AtomicU64; 2]; MAX_ORDINALS],
    uuid_known: [AtomicBool; MAX_ORDINALS],
    /// Ordinal → allocation granularity (0 = not looked up).
    granularity: [AtomicU64; MAX_ORDINALS],
    books: Mutex<Books>,
    registering: Mutex<()>,
    /// Serialises primary-context retain/release/reset bookkeeping.
    pub primary_ops: Mutex<()>,
}

static MODE: crate::fork::Once<Mode> = crate::fork::Once::new();

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
            Mode::Enforce(_) => {}
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
                tessera_error_chain::with_causes(&e),
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
        Err(e) => return unusable(tessera_error_chain::with_causes(&e)),
    };
    let e = Enforcer {
        single: AtomicU64::new(u64::MAX),
        control,
        usage,
        slot: AtomicUsize::new(NO_SLOT),
        owner: AtomicU64::new(0),
        pid: AtomicU32::new(0),
        start_time: AtomicU64::new(0),
        devices: [const { AtomicU64::new(0) }; MAX_ORDINALS],
        uuids: [const { [AtomicU64::new(0), AtomicU64::new(0)] }; MAX_ORDINALS],
        uuid_known: [const { AtomicBool::new(false) }; MAX_ORDINALS],
        granularity: [const { AtomicU64::new(0) }; MAX_ORDINALS],
        books: Mutex::new(Books::default()),
        registering: Mutex::new(()),
        primary_ops: Mutex::new(()),
    };
    if let Err(why) = e.register() {
        return Mode::Refuse(tessera_error_chain::with_causes(&why));
    }
    Mode::Enforce(Box::new(e))
}

/// Set once the real `cuInit` succeeded in this process under limits.
pub static CUDA_INITIALIZED: AtomicBool = AtomicBool::new(false);

/// Set in a child forked after CUDA was initialised. CUDA state does not
/// survive a fork (the driver refuses it), and neither do this library's
/// books: limited calls in the child fail with
/// `CUDA_ERROR_NOT_INITIALIZED` (see `hooks::dispatch`). A child that
/// execs starts afresh.
pub static FORKED: AtomicBool = AtomicBool::new(false);

/// The locks of the enforcer, held by the forking thread across a fork
/// (see `fork.rs`); dropping it releases them.
pub struct ForkHeld {
    _primary: MutexGuard<'static, ()>,
    _books: MutexGuard<'static, Books>,
    _registering: MutexGuard<'static, ()>,
}

/// Waits for and takes the enforcer's locks, in lock order
/// (`primary_ops`, `books`, `registering`), for a fork.
pub fn lock_for_fork() -> Option<ForkHeld> {
    let Some(Mode::Enforce(e)) = MODE.get() else {
        return None;
    };
    let e: &'static Enforcer = e;
    let lock = |m: &'static Mutex<()>| m.lock().unwrap_or_else(|p| p.into_inner());
    Some(ForkHeld {
        _primary: lock(&e.primary_ops),
        _books: e.books(),
        _registering: lock(&e.registering),
    })
}

/// Runs in the child after `fork`, once the locks are released (see
/// `fork.rs`). A child of a process that never initialised CUDA (say, one
/// that only asked NVML) may use CUDA itself: it forgets the parent's
/// slot and claims its own on first use, so its bytes are its own.
pub fn forked() {
    // The forking thread's launch batch is the parent's.
    crate::throttle::forget();
    if CUDA_INITIALIZED.load(Ordering::Relaxed) {
        FORKED.store(true, Ordering::Relaxed);
    } else if let Some(Mode::Enforce(e)) = MODE.get() {
        e.slot.store(NO_SLOT, Ordering::Relaxed);
        e.pid.store(0, Ordering::Relaxed);
    }
}

/// Tag of a device cache entry for a GPU not assigned to the container.
const NOT_ASSIGNED: u64 = 0xff;

/// The control epoch a cached fact must have been computed under to
/// hold now. While a write is under way (odd epoch) that is the epoch
/// before it: a fact from then reads as a read made just before the write
/// began (and a writer that died mid-write does not make every call look
/// the facts up again).
fn current_epoch(control: &ControlRegion) -> u64 {
    control.epoch() & !1
}

/// The bits of control epoch `epoch` that fit above `shift` tag bits.
fn epoch_bits(epoch: u64, shift: u32) -> u64 {
    (epoch << shift) >> shift
}

/// Where device `ordinal`'s facts are cached, if it has a place.
fn cache_index(ordinal: i32) -> Option<usize> {
    usize::try_from(ordinal).ok().filter(|&i| i < MAX_ORDINALS)
}

impl Enforcer {
    /// Claims a process slot (reclaiming dead processes' if the table is
    /// full).
    fn register(&self) -> Result<usize, RegionError> {
        let pid = sys::getpid();
        let tag = sys::pid_ns_tag();
        let start = sys::start_time(pid).map_or(0, |t| start::word(tag, t));
        let claim = match self.usage.claim(pid, start) {
            Some(s) => s,
            None => {
                self.usage
                    .reclaim_dead((pid, start), sys::slot_owner_alive(tag));
                self.usage
                    .claim(pid, start)
                    .ok_or_else(|| RegionError::Full {
                        path: self.usage.path().to_path_buf(),
                        slots: tessera_region::MAX_SLOTS,
                    })?
            }
        };
        self.pid.store(pid, Ordering::Release);
        self.start_time.store(start, Ordering::Release);
        self.owner.store(claim.owner, Ordering::Release);
        self.slot.store(claim.slot, Ordering::Release);
        Ok(claim.slot)
    }

    /// This process's slot, claiming one if needed (in a forked child, or
    /// if a reclaimer took ours).
    pub fn slot(&self) -> Result<usize, RegionError> {
        let s = self.slot.load(Ordering::Acquire);
        if s != NO_SLOT && self.owns(s) {
            return Ok(s);
        }
        // One registration at a time, so racing threads claim one slot.
        let _one = self.registering.lock().unwrap_or_else(|p| p.into_inner());
        let s = self.slot.load(Ordering::Acquire);
        if s != NO_SLOT && self.owns(s) {
            return Ok(s);
        }
        self.register()
    }

    fn owns(&self, slot: usize) -> bool {
        self.usage.owns(Claim {
            slot,
            owner: self.owner.load(Ordering::Acquire),
        })
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

    /// The charged-objects books. Lock order: after `primary_ops`, before
    /// `registering`; never held across a driver call.
    pub fn books(&self) -> MutexGuard<'_, Books> {
        self.books.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The control index of device `ordinal` under the current control
    /// epoch (`None`: not assigned to the container). `uuid_of` asks the
    /// driver for the device's UUID, once per ordinal; the index is looked
    /// up again whenever the epoch changed, so a new GPU set (the agent
    /// rewrote the control region) is seen by the next call.
    pub fn device_index(
        &self,
        ordinal: i32,
        uuid_of: impl FnOnce() -> Result<[u8; 16], crate::ffi::CUresult>,
    ) -> Result<Option<usize>, crate::ffi::CUresult> {
        let slot = cache_index(ordinal);
        if let Some(i) = slot {
            let v = self.devices[i].load(Ordering::Acquire);
            let tag = v & 0xff;
            if tag != 0 && v >> 8 == epoch_bits(current_epoch(&self.control), 8) {
                return Ok((tag != NOT_ASSIGNED).then(|| tag as usize - 1));
            }
        }
        let uuid = match slot.filter(|&i| self.uuid_known[i].load(Ordering::Acquire)) {
            Some(i) => {
                let [lo, hi] = &self.uuids[i];
                let mut u = [0u8; 16];
                u[..8].copy_from_slice(&lo.load(Ordering::Relaxed).to_le_bytes());
                u[8..].copy_from_slice(&hi.load(Ordering::Relaxed).to_le_bytes());
                u
            }
            None => {
                let u = uuid_of()?;
                if let Some(i) = slot {
                    let (lo, hi) = u.split_at(8);
                    let word = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap_or([0; 8]));
                    self.uuids[i][0].store(word(lo), Ordering::Relaxed);
                    self.uuids[i][1].store(word(hi), Ordering::Relaxed);
                    self.uuid_known[i].store(true, Ordering::Release);
                }
                u
            }
        };
        // The index and the epoch it holds for come from one consistent
        // view, so a write racing this lookup leaves a stale epoch (looked
        // up again), never a stale index under the new epoch.
        let view = self.control.snapshot();
        let index = view.gpus.iter().position(|g| g.uuid == uuid);
        if let Some(i) = slot {
            let tag = index.map_or(NOT_ASSIGNED, |x| x as u64 + 1);
            self.devices[i].store(epoch_bits(view.epoch, 8) << 8 | tag, Ordering::Release);
        }
        Ok(index)
    }

    /// The control epoch under which the container has exactly one GPU, if
    /// it has one under the current control epoch (launches then need no
    /// device lookup: they go to GPU 0); `None` if it has another number.
    /// The epoch is that of the view the GPUs were counted in (even), so a
    /// caller that caches "one GPU" keys it on that epoch.
    #[inline]
    pub fn single_gpu_epoch(&self) -> Option<u64> {
        let now = current_epoch(&self.control);
        let v = self.single.load(Ordering::Relaxed);
        if v == now {
            return Some(now);
        }
        if v == now | 1 {
            return None;
        }
        self.count_gpus()
    }

    /// [`Enforcer::single_gpu_epoch`]'s slow path: counts the GPUs afresh.
    #[cold]
    fn count_gpus(&self) -> Option<u64> {
        let view = self.control.snapshot();
        let single = view.gpus.len() == 1;
        let v = if single { view.epoch } else { view.epoch | 1 };
        self.single.store(v, Ordering::Relaxed);
        single.then_some(view.epoch)
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
        self.usage
            .reclaim_dead(me, sys::slot_owner_alive(sys::pid_ns_tag()));
    }
}
