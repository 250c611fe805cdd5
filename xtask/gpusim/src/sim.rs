//! The simulated node as one process sees it: the operations the stand-in
//! CUDA and NVML libraries (and the `gpusim` CLI) are built from.
//!
//! A process *attaches* to a GPU when it creates its first context there;
//! that claims a channel (its memory account and launch queue on that GPU).
//! Work is *submitted* to the channel and *waited* for by sequence number.
//! Every operation first brings the GPU's timeline up to now.
//!
//! Dead processes are looked for whenever a GPU's memory or processes are
//! queried and before an allocation is refused (through pidfds, falling
//! back to `/proc`: see `liveness.rs` and `procfs.rs`); their channels,
//! memory and queued work go away as they would when a real driver sees the
//! process's files close.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::layout::{GpuInner, ItemKind, MAX_CHANNELS, Owner, XID_LOG, XidRecord};
use crate::liveness::Liveness;
use crate::node::{NodeDescription, uuid_bytes};
use crate::pci::PciAddress;
use crate::pidns::{self, PidView, Seen};
use crate::state::{Config, GpuGuard, State, StateError};
use crate::sys;
use crate::timeline::{self, Params};

/// Dead processes are looked for at least this often (ns) by any operation
/// on a GPU, so their queued work stops taking time slices; queries and
/// refused allocations always look.
pub const REAP_INTERVAL_NS: u64 = 100_000_000;

/// Xid the simulator records when a GPU is marked lost ("fallen off the bus").
pub const XID_FALLEN_OFF_BUS: u64 = 79;

/// What went wrong in a simulated operation.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The state file is unusable.
    #[error(transparent)]
    State(#[from] StateError),
    /// No GPU with this index.
    #[error("there is no GPU {gpu} on the simulated node ({count} GPUs)")]
    InvalidDevice {
        /// Index asked for.
        gpu: usize,
        /// GPUs present.
        count: usize,
    },
    /// The GPU has been marked lost.
    #[error("GPU {gpu} is lost (fallen off the bus)")]
    DeviceLost {
        /// GPU index.
        gpu: usize,
    },
    /// Not enough free memory.
    #[error("GPU {gpu}: cannot allocate {requested} bytes, {free} bytes free")]
    OutOfMemory {
        /// GPU index.
        gpu: usize,
        /// Bytes asked for.
        requested: u64,
        /// Bytes free.
        free: u64,
    },
    /// Every channel of the GPU is taken by a live process.
    #[error("GPU {gpu}: {MAX_CHANNELS} processes already hold contexts")]
    TooManyProcesses {
        /// GPU index.
        gpu: usize,
    },
    /// The process's channel was taken away (state reset).
    #[error("GPU {gpu}: this process's context was destroyed by a reset of the simulated node")]
    Detached {
        /// GPU index.
        gpu: usize,
    },
    /// A stand-in device could not be opened.
    #[error(transparent)]
    Driver(#[from] crate::ioctl::OpenError),
}

/// A process's claim on a GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attachment {
    /// GPU index.
    pub gpu: usize,
    /// Channel index on that GPU.
    pub channel: usize,
    /// Token proving the channel is still this process's.
    pub token: u64,
}

/// Device utilisation over the configured window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Utilization {
    /// Percent of time a kernel ran.
    pub gpu: u32,
    /// Percent of time a copy ran.
    pub memory: u32,
}

/// One process's share of a GPU over a window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcessSample {
    /// Process id.
    pub pid: i32,
    /// Percent of the window its kernels ran.
    pub sm_percent: u32,
    /// Window end (Unix µs).
    pub timestamp_us: u64,
}

/// A process holding memory on a GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcessMemory {
    /// Process id.
    pub pid: i32,
    /// Device memory, including context overhead (bytes).
    pub bytes: u64,
}

/// Memory of one GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryInfo {
    /// Framebuffer size.
    pub total: u64,
    /// Reserved by the driver.
    pub reserved: u64,
    /// Held by processes.
    pub used: u64,
    /// Allocatable.
    pub free: u64,
}

/// One process's handle on the simulated node.
///
/// GPUs are numbered as the process sees them: all of the node's, in
/// node order ([`Sim::open`], the host's view), or only those whose
/// stand-in device node it can open ([`Sim::visible_only`], what
/// `cuInit` and `nvmlInit` use), numbered from 0 in node order, as a real
/// driver enumerates a container's GPUs. Every `gpu` argument and result
/// is such an ordinal; the state file keeps node indices
/// ([`Sim::node_index`] translates). Pids are the reader's own (see
/// `pidns.rs`).
pub struct Sim {
    state: State,
    params: Params,
    window_ns: u64,
    /// This process as it records itself.
    me: Owner,
    /// The node as this process sees it: its visible GPUs only.
    view: NodeDescription,
    /// Node index of each visible GPU, by ordinal.
    node_index: Vec<usize>,
    pci: Vec<PciAddress>,
    /// Pidfds of the channel owners this process has asked about.
    liveness: Liveness,
    /// Recorded pids as this process's pid namespace shows them.
    pids: PidView,
}

static TOKENS: AtomicU64 = AtomicU64::new(1);

impl Sim {
    /// Opens the node from `GPUSIM_NODE` / `GPUSIM_STATE`.
    pub fn from_env() -> Result<Self, SimError> {
        Self::open(&Config::from_env())
    }

    /// Opens the node described by `cfg`.
    pub fn open(cfg: &Config) -> Result<Self, SimError> {
        let state = State::open(cfg)?;
        let s = &state.node().scheduler;
        let params = Params {
            timeslice_ns: s.timeslice_us * 1_000,
            queue_depth: s.queue_depth,
        };
        let window_ns = s.utilization_window_ms * 1_000_000;
        let all: Vec<usize> = (0..state.gpu_count()).collect();
        let view = view_of(state.node(), &all);
        let pci = (0..state.gpu_count())
            .map(|i| state.node().pci_address(i))
            .collect();
        Ok(Self {
            pci,
            view,
            node_index: all,
            state,
            params,
            window_ns,
            me: pidns::me(),
            liveness: Liveness::new(),
            pids: PidView::new(),
        })
    }

    /// This handle restricted to the GPUs whose stand-in device node
    /// (`ioctl.gpu_devices`) this process can open, numbered from 0 in
    /// node order; a GPU without a stand-in is always visible. UUIDs, PCI
    /// bus ids and NVLink peers stay the GPUs' own.
    pub fn visible_only(mut self) -> Self {
        let node = self.state.node();
        let visible: Vec<usize> = (0..self.state.gpu_count())
            .filter(|&i| {
                node.ioctl
                    .gpu_devices
                    .get(i)
                    .is_none_or(|p| sys::open_device(p).is_ok())
            })
            .collect();
        self.view = view_of(node, &visible);
        self.pci = (0..visible.len())
            .map(|i| self.view.pci_address(i))
            .collect();
        self.node_index = visible;
        self
    }

    /// The node description as this process sees it (its visible GPUs).
    pub fn node(&self) -> &NodeDescription {
        &self.view
    }

    /// The node index (the state file's, `/dev/nvidia<index>`'s) of GPU
    /// `gpu` as this process numbers it. Panics if `gpu` is out of range.
    pub fn node_index(&self, gpu: usize) -> usize {
        self.node_index[gpu]
    }

    /// The ordinal this process gives node GPU `index`, if it sees it.
    pub fn ordinal_of(&self, index: usize) -> Option<usize> {
        self.node_index.iter().position(|&i| i == index)
    }

    /// This process's pid namespace view.
    pub fn pid_view(&self) -> &PidView {
        &self.pids
    }

    /// The state file.
    pub fn state(&self) -> &State {
        &self.state
    }

    /// Number of GPUs this process sees.
    pub fn gpu_count(&self) -> usize {
        self.node_index.len()
    }

    /// Rounds a device allocation up to the allocation granularity.
    pub fn round_allocation(&self, bytes: u64) -> u64 {
        let g = self.node().cost.alloc_granularity_kib * 1024;
        bytes.max(1).div_ceil(g).saturating_mul(g)
    }

    /// Memory one context costs on its GPU.
    pub fn context_overhead(&self) -> u64 {
        self.node().cost.context_overhead_mib << 20
    }

    /// Checks a GPU ordinal; returns its node index.
    fn check_gpu(&self, gpu: usize) -> Result<usize, SimError> {
        if let Some(&index) = self.node_index.get(gpu) {
            Ok(index)
        } else {
            Err(SimError::InvalidDevice {
                gpu,
                count: self.gpu_count(),
            })
        }
    }

    /// Locks `gpu` and brings its timeline up to now.
    fn lock(&self, gpu: usize) -> Result<GpuGuard<'_>, SimError> {
        self.lock_reaping(gpu, false)
    }

    /// Locks `gpu`, reaping dead processes first when `force` is set (queries
    /// of memory and processes) or when [`REAP_INTERVAL_NS`] has passed, then
    /// brings its timeline up to now.
    fn lock_reaping(&self, gpu: usize, force: bool) -> Result<GpuGuard<'_>, SimError> {
        let index = self.check_gpu(gpu)?;
        let mut g = self.state.lock(index)?;
        let now = sys::monotonic_ns();
        // The last holder died inside its update: put the GPU back in
        // shape, and release the dead holder's channel now rather than at
        // the next periodic reap.
        if g.recovered {
            timeline::repair(&mut g);
        }
        // Dead processes' queues must not keep taking time slices.
        if force || g.recovered || now.saturating_sub(g.last_reap_ns) >= REAP_INTERVAL_NS {
            self.reap(&mut g, index);
        }
        timeline::advance(&mut g, now, self.params);
        Ok(g)
    }

    fn lock_live(&self, gpu: usize) -> Result<GpuGuard<'_>, SimError> {
        let g = self.lock(gpu)?;
        if g.lost() {
            return Err(SimError::DeviceLost { gpu });
        }
        Ok(g)
    }

    fn check(g: &GpuGuard<'_>, a: &Attachment) -> Result<(), SimError> {
        let ch = &g.channels[a.channel % MAX_CHANNELS];
        if ch.active == 1 && ch.token == a.token {
            Ok(())
        } else {
            Err(SimError::Detached { gpu: a.gpu })
        }
    }

    fn memory(&self, g: &GpuGuard<'_>, gpu: usize) -> MemoryInfo {
        let d = &self.node().gpu[gpu];
        let total = d.memory_mib << 20;
        let reserved = d.reserved_mib << 20;
        let used = g
            .channels
            .iter()
            .filter(|c| c.active == 1)
            .fold(0u64, |a, c| a.saturating_add(c.mem_bytes));
        MemoryInfo {
            total,
            reserved,
            used,
            free: total.saturating_sub(reserved).saturating_sub(used),
        }
    }

    /// Succeeds if `bytes` fit in `gpu`'s free memory, reaping dead
    /// processes first when they do not; else fails with
    /// [`SimError::OutOfMemory`].
    fn make_room(&self, g: &mut GpuGuard<'_>, gpu: usize, bytes: u64) -> Result<(), SimError> {
        if bytes <= self.memory(g, gpu).free {
            return Ok(());
        }
        self.reap(g, self.node_index[gpu]);
        let free = self.memory(g, gpu).free;
        if bytes <= free {
            Ok(())
        } else {
            Err(SimError::OutOfMemory {
                gpu,
                requested: bytes,
                free,
            })
        }
    }

    /// Releases the channels of node GPU `index` (locked as `g`) whose
    /// processes have exited, as far as this process can tell: one it
    /// cannot see (another container's) is left alone. A reader in the
    /// initial pid namespace notes the host pid of each process it finds.
    fn reap(&self, g: &mut GpuGuard<'_>, index: usize) {
        g.last_reap_ns = sys::monotonic_ns();
        let mut pass = self.liveness.pass(index);
        let inner: &mut GpuInner = g;
        for c in 0..MAX_CHANNELS {
            let ch = &mut inner.channels[c];
            if ch.active != 1 {
                continue;
            }
            let owner = ch.owner;
            let alive = match self.pids.see(&owner) {
                Seen::Pid(p) => {
                    let alive = pass.alive(p, owner.start_time);
                    if alive && self.pids.is_initial() && owner.init_pid == 0 {
                        ch.owner.init_pid = p;
                        if ch.launches.owner == owner {
                            ch.launches.owner.init_pid = p;
                        }
                    }
                    alive
                }
                Seen::Gone => false,
                Seen::Hidden => true,
            };
            if !alive {
                timeline::clear_channel(inner, c);
            }
        }
    }

    /// The pid this process gives `o`, if it can see it.
    fn pid_of(&self, o: &Owner) -> Option<i32> {
        match self.pids.see(o) {
            Seen::Pid(p) => Some(p),
            Seen::Gone | Seen::Hidden => None,
        }
    }

    /// Pidfds this handle keeps to tell whether channel owners still run.
    pub fn cached_pidfds(&self) -> usize {
        self.liveness.cached()
    }

    /// Claims (or re-uses) this process's channel on `gpu` for one more
    /// context, charging the context's memory.
    pub fn attach(&self, gpu: usize) -> Result<Attachment, SimError> {
        self.attach_channel(gpu).map(|(a, _)| a)
    }

    /// As [`attach`](Self::attach); also says whether this attach claimed
    /// the channel (the process's first context on `gpu`).
    pub fn attach_channel(&self, gpu: usize) -> Result<(Attachment, bool), SimError> {
        let overhead = self.context_overhead();
        let mut g = self.lock_live(gpu)?;
        let mine = (0..MAX_CHANNELS).find(|&c| {
            let ch = &g.channels[c];
            ch.active == 1
                && ch.owner.pid == self.me.pid
                && ch.owner.pid_ns == self.me.pid_ns
                && ch.owner.start_time == self.me.start_time
        });
        let (channel, first) = match mine {
            Some(c) => (c, false),
            None => {
                let free =
                    |g: &GpuGuard<'_>| (0..MAX_CHANNELS).find(|&c| g.channels[c].active == 0);
                let c = match free(&g) {
                    Some(c) => c,
                    None => {
                        self.reap(&mut g, self.node_index[gpu]);
                        free(&g).ok_or(SimError::TooManyProcesses { gpu })?
                    }
                };
                (c, true)
            }
        };
        self.make_room(&mut g, gpu, overhead)?;
        if first {
            timeline::clear_channel(&mut g, channel);
            crate::launch_log::clear(&mut g.channels[channel].launches, self.me);
            let token = (sys::realtime_ns() ^ ((self.me.pid as u64) << 40))
                .wrapping_add(TOKENS.fetch_add(1, Ordering::Relaxed))
                | 1;
            let ch = &mut g.channels[channel];
            ch.owner = self.me;
            ch.token = token;
            ch.active = 1;
        }
        let ch = &mut g.channels[channel];
        ch.contexts = ch.contexts.saturating_add(1);
        ch.mem_bytes = ch.mem_bytes.saturating_add(overhead);
        Ok((
            Attachment {
                gpu,
                channel,
                token: ch.token,
            },
            first,
        ))
    }

    /// Gives back one context; the channel goes when the last one does.
    /// Returns whether that happened.
    pub fn detach(&self, a: &Attachment) -> Result<bool, SimError> {
        let mut g = self.lock(a.gpu)?;
        Self::check(&g, a)?;
        let overhead = self.context_overhead();
        let ch = &mut g.channels[a.channel];
        ch.contexts = ch.contexts.saturating_sub(1);
        ch.mem_bytes = ch.mem_bytes.saturating_sub(overhead);
        if ch.contexts == 0 {
            timeline::clear_channel(&mut g, a.channel);
            return Ok(true);
        }
        Ok(false)
    }

    /// Charges `bytes` of device memory to this process, or fails with
    /// [`SimError::OutOfMemory`] and charges nothing.
    pub fn alloc(&self, a: &Attachment, bytes: u64) -> Result<(), SimError> {
        let mut g = self.lock_live(a.gpu)?;
        Self::check(&g, a)?;
        self.make_room(&mut g, a.gpu, bytes)?;
        // Reaping must not have taken this channel; check again.
        Self::check(&g, a)?;
        let ch = &mut g.channels[a.channel];
        ch.mem_bytes = ch.mem_bytes.saturating_add(bytes);
        Ok(())
    }

    /// Returns `bytes` of device memory.
    pub fn free(&self, a: &Attachment, bytes: u64) -> Result<(), SimError> {
        let mut g = self.lock(a.gpu)?;
        Self::check(&g, a)?;
        let ch = &mut g.channels[a.channel];
        ch.mem_bytes = ch.mem_bytes.saturating_sub(bytes);
        Ok(())
    }

    /// Memory of `gpu`.
    pub fn memory_info(&self, gpu: usize) -> Result<MemoryInfo, SimError> {
        let g = self.lock_reaping(gpu, true)?;
        Ok(self.memory(&g, gpu))
    }

    /// Queues work on this process's channel, waiting while its queue is
    /// full. Returns the item's sequence number.
    pub fn submit(&self, a: &Attachment, kind: ItemKind, ns: u64) -> Result<u64, SimError> {
        loop {
            let wait = {
                let mut g = self.lock_live(a.gpu)?;
                Self::check(&g, a)?;
                match timeline::enqueue(&mut g, a.channel, kind, ns, self.params) {
                    Ok(seq) => return Ok(seq),
                    // Full: at least the head item must finish first.
                    Err(timeline::QueueFull) => {
                        let ch = &g.channels[a.channel];
                        timeline::work_until(ch, ch.completed)
                    }
                }
            };
            sleep_ns(wait.clamp(20_000, 2_000_000));
        }
    }

    /// [`submit`](Self::submit) of a kernel of `warps` warps, recorded in
    /// the channel's launch log (see [`Sim::launches`]).
    pub fn submit_kernel(&self, a: &Attachment, ns: u64, warps: u64) -> Result<u64, SimError> {
        loop {
            let wait = {
                let mut g = self.lock_live(a.gpu)?;
                Self::check(&g, a)?;
                match timeline::enqueue(&mut g, a.channel, ItemKind::Kernel, ns, self.params) {
                    Ok(seq) => {
                        let now = g.sim_time_ns;
                        crate::launch_log::record(&mut g.channels[a.channel].launches, now, warps);
                        return Ok(seq);
                    }
                    Err(timeline::QueueFull) => {
                        let ch = &g.channels[a.channel];
                        timeline::work_until(ch, ch.completed)
                    }
                }
            };
            sleep_ns(wait.clamp(20_000, 2_000_000));
        }
    }

    /// The kernels each process launched on `gpu` (processes that detached
    /// are listed until their channel is claimed again), each under its pid
    /// in this process's pid namespace, or pid 0 where this process cannot
    /// name it (another container's, or one that exited before a reader in
    /// the initial namespace found it).
    pub fn launches(&self, gpu: usize) -> Result<Vec<crate::launch_log::Launches>, SimError> {
        let g = self.lock(gpu)?;
        Ok(g.channels
            .iter()
            .filter(|c| c.launches.kernels != 0)
            .map(|c| {
                let mut l = crate::launch_log::read(&c.launches, c.active == 1);
                l.pid = self.pid_of(&c.launches.owner).unwrap_or(0);
                l
            })
            .collect())
    }

    /// Whether item `seq` has completed.
    pub fn is_complete(&self, a: &Attachment, seq: u64) -> Result<bool, SimError> {
        let g = self.lock(a.gpu)?;
        Self::check(&g, a)?;
        Ok(timeline::is_complete(&g.channels[a.channel], seq))
    }

    /// Waits until item `seq` has completed.
    pub fn wait(&self, a: &Attachment, seq: u64) -> Result<(), SimError> {
        loop {
            let left = {
                let g = self.lock(a.gpu)?;
                Self::check(&g, a)?;
                let ch = &g.channels[a.channel];
                if timeline::is_complete(ch, seq) {
                    return Ok(());
                }
                if g.lost() {
                    return Err(SimError::DeviceLost { gpu: a.gpu });
                }
                // Channels sharing the GPU take turns: expect the wait to
                // stretch by their number.
                let busy = (0..MAX_CHANNELS)
                    .filter(|&c| g.channels[c].active == 1 && timeline::pending(&g.channels[c]) > 0)
                    .count()
                    .max(1) as u64;
                timeline::work_until(ch, seq).saturating_mul(busy)
            };
            // The channel needs at least `left` more wall time.
            sleep_ns(left.clamp(5_000, 5_000_000));
        }
    }

    /// The last item submitted by this process on its channel, if any.
    pub fn last_submitted(&self, a: &Attachment) -> Result<Option<u64>, SimError> {
        let g = self.lock(a.gpu)?;
        Self::check(&g, a)?;
        Ok(g.channels[a.channel].submitted.checked_sub(1))
    }

    /// Queues an event marker writing its completion time into event slot
    /// `slot` of this process's channel; returns its sequence number.
    pub fn submit_event(&self, a: &Attachment, slot: usize) -> Result<u64, SimError> {
        loop {
            {
                let mut g = self.lock_live(a.gpu)?;
                Self::check(&g, a)?;
                if let Ok(seq) = timeline::enqueue_event(&mut g, a.channel, slot, self.params) {
                    return Ok(seq);
                }
            }
            sleep_ns(100_000);
        }
    }

    /// Completion time (monotonic ns) written to event slot `slot`.
    pub fn event_time(&self, a: &Attachment, slot: usize) -> Result<Option<u64>, SimError> {
        let g = self.lock(a.gpu)?;
        Self::check(&g, a)?;
        Ok(timeline::event_time(&g.channels[a.channel], slot))
    }

    /// Completion time (monotonic ns) of marker `seq`, once complete.
    pub fn marker_time(&self, a: &Attachment, seq: u64) -> Result<Option<u64>, SimError> {
        let g = self.lock(a.gpu)?;
        Self::check(&g, a)?;
        Ok(timeline::marker_time(&g.channels[a.channel], seq))
    }

    /// Device utilisation over the configured window.
    pub fn utilization(&self, gpu: usize) -> Result<Utilization, SimError> {
        let g = self.lock(gpu)?;
        let now = g.sim_time_ns;
        let b = timeline::busy(&g, now.saturating_sub(self.window_ns), now);
        let pct = |ns: u64| ((ns * 100 + self.window_ns / 2) / self.window_ns).min(100) as u32;
        Ok(Utilization {
            gpu: pct(b.sm_ns),
            memory: pct(b.mem_ns),
        })
    }

    /// Per-process SM use since `since_unix_us` (at most the last 5 s), one
    /// sample per live process holding a context on `gpu`.
    pub fn process_samples(
        &self,
        gpu: usize,
        since_unix_us: u64,
    ) -> Result<Vec<ProcessSample>, SimError> {
        let g = self.lock_reaping(gpu, true)?;
        let now = g.sim_time_ns;
        let real_us = sys::realtime_ns() / 1_000;
        let back_ns = real_us.saturating_sub(since_unix_us).saturating_mul(1_000);
        let span = crate::layout::BUCKET_NS * (crate::layout::HISTORY_BUCKETS as u64 - 1);
        let window = back_ns.clamp(crate::layout::BUCKET_NS, span);
        let t0 = now.saturating_sub(window);
        Ok((0..MAX_CHANNELS)
            .filter(|&c| g.channels[c].active == 1)
            .filter_map(|c| {
                let pid = self.pid_of(&g.channels[c].owner)?;
                let busy = timeline::channel_busy(&g, c, t0, now);
                Some(ProcessSample {
                    pid,
                    sm_percent: ((busy * 100 + window / 2) / window).min(100) as u32,
                    timestamp_us: real_us,
                })
            })
            .collect())
    }

    /// Processes holding memory on `gpu` that this process can see, under
    /// their pids in its pid namespace: as NVIDIA's driver does, a process
    /// another container runs is left out (its memory still counts in
    /// [`memory_info`](Self::memory_info)).
    pub fn processes(&self, gpu: usize) -> Result<Vec<ProcessMemory>, SimError> {
        let g = self.lock_reaping(gpu, true)?;
        Ok(g.channels
            .iter()
            .filter(|c| c.active == 1)
            .filter_map(|c| {
                Some(ProcessMemory {
                    pid: self.pid_of(&c.owner)?,
                    bytes: c.mem_bytes,
                })
            })
            .collect())
    }

    /// Whether `gpu` is marked lost (an atomic read; the GPU's lock is not
    /// taken).
    pub fn is_lost(&self, gpu: usize) -> Result<bool, SimError> {
        let index = self.check_gpu(gpu)?;
        Ok(self.state.gpu(index).lost.load(Ordering::Acquire) != 0)
    }

    /// Records an Xid on `gpu`; returns its sequence number.
    pub fn inject_xid(&self, gpu: usize, xid: u64) -> Result<u64, SimError> {
        let mut g = self.lock(gpu)?;
        let seq = g.xid_next.max(1);
        g.xid_next = seq.saturating_add(1);
        g.xids[((seq - 1) % XID_LOG as u64) as usize] = XidRecord {
            seq,
            xid,
            unix_ns: sys::realtime_ns(),
        };
        Ok(seq)
    }

    /// Sequence number of the newest Xid on `gpu` (0 if none).
    pub fn xid_cursor(&self, gpu: usize) -> Result<u64, SimError> {
        Ok(self.lock(gpu)?.xid_next.saturating_sub(1))
    }

    /// Xids on `gpu` newer than `after`, oldest first (at most the last
    /// [`XID_LOG`]).
    pub fn xids_after(&self, gpu: usize, after: u64) -> Result<Vec<XidRecord>, SimError> {
        let g = self.lock(gpu)?;
        let mut v: Vec<XidRecord> = g.xids.iter().filter(|r| r.seq > after).copied().collect();
        v.sort_by_key(|r| r.seq);
        Ok(v)
    }

    /// Marks `gpu` lost (recording Xid 79) or healthy again.
    ///
    /// The Xid is recorded before the flag is set: whoever sees the flag
    /// ([`is_lost`](Self::is_lost)) and then reads the Xids finds the one
    /// that says why (NVML delivers it before reporting the GPU lost).
    pub fn set_lost(&self, gpu: usize, lost: bool) -> Result<(), SimError> {
        let index = self.check_gpu(gpu)?;
        if lost {
            self.inject_xid(gpu, XID_FALLEN_OFF_BUS)?;
        }
        self.state
            .gpu(index)
            .lost
            .store(u32::from(lost), Ordering::Release);
        Ok(())
    }

    /// Clears everything on `gpu`: channels, memory, history, Xids, lost.
    pub fn reset_gpu(&self, gpu: usize) -> Result<(), SimError> {
        let mut g = self.lock(gpu)?;
        timeline::clear_all(&mut g);
        g.xids = [XidRecord::default(); XID_LOG];
        g.xid_next = 1;
        self.state
            .gpu(self.node_index[gpu])
            .lost
            .store(0, Ordering::Release);
        Ok(())
    }

    /// The PCI address of `gpu` (parsed once, at open). Panics if `gpu` is
    /// out of range.
    pub fn pci_address(&self, gpu: usize) -> PciAddress {
        self.pci[gpu]
    }

    /// The GPU at PCI address `a`, if any.
    pub fn gpu_at(&self, a: PciAddress) -> Option<usize> {
        self.pci.iter().position(|&p| p == a)
    }

    /// The UUID bytes of `gpu`.
    pub fn uuid_bytes(&self, gpu: usize) -> [u8; 16] {
        uuid_bytes(&self.node().uuid(gpu)).unwrap_or([0; 16])
    }
}

/// `node` as a process seeing only its GPUs `visible` (node indices, in
/// order) finds it: those GPUs, numbered from 0, with their own UUIDs, PCI
/// bus ids and stand-in devices, and NVLink peers among them.
fn view_of(node: &NodeDescription, visible: &[usize]) -> NodeDescription {
    let mut view = node.clone();
    if visible.len() == node.gpu.len() {
        return view;
    }
    view.gpu = visible
        .iter()
        .map(|&i| {
            let mut g = node.gpu[i].clone();
            g.uuid = Some(node.uuid(i));
            g.pci_bus_id = Some(node.pci_address(i).nvml());
            g.nvlink_peers = g
                .nvlink_peers
                .iter()
                .filter_map(|&p| visible.iter().position(|&v| v == p as usize))
                .map(|p| p as u32)
                .collect();
            g
        })
        .collect();
    // Stand-ins are listed for the first GPUs: the visible ones among
    // them come first, in order.
    view.ioctl.gpu_devices = visible
        .iter()
        .filter_map(|&i| node.ioctl.gpu_devices.get(i).cloned())
        .collect();
    view
}

/// Sleeps about `ns`.
pub fn sleep_ns(ns: u64) {
    std::thread::sleep(Duration::from_nanos(ns));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A default node in a private state file.
    fn sim() -> (tempfile::TempDir, Sim) {
        let dir = tempfile::tempdir().unwrap();
        let cfg = Config {
            node_path: None,
            state_path: dir.path().join("state"),
        };
        let sim = Sim::open(&cfg).unwrap();
        (dir, sim)
    }

    #[test]
    fn only_the_first_attach_claims_the_channel() {
        let (_dir, sim) = sim();
        let (a, first) = sim.attach_channel(0).unwrap();
        let (b, again) = sim.attach_channel(0).unwrap();
        assert!(first && !again);
        // Both contexts' attachments name the same channel.
        assert_eq!(a, b);
        assert!(!sim.detach(&b).unwrap());
        assert!(sim.detach(&a).unwrap());
    }

    #[test]
    fn a_holder_that_dies_mid_update_is_cleaned_up_by_the_next_lock() {
        let (_dir, sim) = sim();
        let status = sys::in_child(|| {
            let mut g = sim.state().lock(0).unwrap();
            // Half an attach (channel claimed and charged), a flag torn
            // into garbage, a slice owner out of range, and a reap that
            // seems to have just happened; then death with the lock held.
            let ch = &mut g.channels[5];
            ch.owner = pidns::me();
            ch.mem_bytes = 1 << 30;
            ch.active = 1;
            g.channels[9].active = 7;
            g.slice_owner_plus_one = 1000;
            g.last_reap_ns = u64::MAX / 2;
            std::mem::forget(g);
        });
        assert_eq!(status, 0, "the child failed");
        // An operation that does not reap by itself recovers the lock...
        assert_eq!(sim.xid_cursor(0).unwrap(), 0);
        // ...left consistent, with the dead holder's channel and the torn
        // one released.
        let g = sim.state().lock(0).unwrap();
        assert!(!g.recovered, "the recovered lock was marked consistent");
        assert_eq!(g.channels[5].active, 0, "the dead holder's channel");
        assert_eq!(g.channels[9].active, 0, "the torn channel");
        assert_eq!(g.slice_owner_plus_one, 0);
        drop(g);
        assert_eq!(sim.memory_info(0).unwrap().used, 0);
    }

    #[test]
    fn a_gpu_seen_lost_already_has_its_xid() {
        let (_dir, sim) = sim();
        // Held, so that marking the GPU lost stops where it takes the lock.
        let held = sim.state().lock(0).unwrap();
        std::thread::scope(|s| {
            let sim = &sim;
            let setter = s.spawn(move || sim.set_lost(0, true).map_err(|e| e.to_string()));
            let until = std::time::Instant::now() + Duration::from_millis(200);
            while std::time::Instant::now() < until {
                if sim.is_lost(0).unwrap() {
                    let xids: Vec<u64> = held.xids.iter().map(|x| x.xid).collect();
                    assert!(xids.contains(&XID_FALLEN_OFF_BUS), "lost before its Xid");
                }
                sleep_ns(1_000_000);
            }
            drop(held);
            setter.join().unwrap().unwrap();
        });
        assert!(sim.is_lost(0).unwrap());
        let xids: Vec<u64> = sim
            .xids_after(0, 0)
            .unwrap()
            .iter()
            .map(|x| x.xid)
            .collect();
        assert_eq!(xids, [XID_FALLEN_OFF_BUS]);
    }

    #[test]
    fn the_lost_flag_is_read_without_the_lock() {
        let (_dir, sim) = sim();
        sim.set_lost(1, true).unwrap();
        let held = sim.state().lock(1).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::scope(|s| {
            let sim = &sim;
            s.spawn(move || tx.send(sim.is_lost(1).map_err(|e| e.to_string())));
            let answer = rx.recv_timeout(Duration::from_secs(10));
            drop(held);
            assert_eq!(answer.expect("is_lost waited for the GPU lock"), Ok(true));
        });
        assert!(!sim.is_lost(0).unwrap());
        assert!(matches!(
            sim.is_lost(2),
            Err(SimError::InvalidDevice { gpu: 2, count: 2 })
        ));
    }
}
