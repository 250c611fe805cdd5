//! The per-GPU timeline: queued work, time slicing and activity history.
//!
//! The timeline is simulated lazily. Whoever holds the GPU lock first calls
//! [`advance`] to bring it up to "now"; that replays what the GPU did since
//! the last call:
//!
//! - each process's channel runs its items in launch order;
//! - when several channels have work, they take turns: the channel holding
//!   the slice runs until its slice (`timeslice_ns`) is used up or it runs
//!   dry, then the next channel with work (round robin) gets a fresh slice;
//!   a kernel longer than a slice is preempted and resumes on its next turn,
//!   as compute preemption does on real GPUs;
//! - every ns a kernel runs is added to the history buckets, for the whole
//!   device and for its channel; copies are recorded as memory activity.
//!
//! Everything here is pure computation on [`GpuInner`], so it is tested
//! without shared memory. It never trusts stored indices: all are reduced
//! modulo their capacity, so a corrupt state file cannot cause a panic.

use crate::layout::{
    BUCKET_NS, Bucket, Channel, EVENT_SLOTS, GpuInner, HISTORY_BUCKETS, Item, ItemKind, MARKER_LOG,
    MAX_CHANNELS, MarkerDone, QUEUE_CAPACITY,
};

/// Scheduling parameters of one GPU.
#[derive(Clone, Copy, Debug)]
pub struct Params {
    /// Slice length (ns).
    pub timeslice_ns: u64,
    /// Pending items a channel may hold (≤ [`QUEUE_CAPACITY`]).
    pub queue_depth: u32,
}

/// Time spent busy over an interval.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Busy {
    /// ns with kernels running.
    pub sm_ns: u64,
    /// ns with copies running.
    pub mem_ns: u64,
}

/// Pending items of a channel.
pub fn pending(ch: &Channel) -> u64 {
    ch.submitted
        .saturating_sub(ch.completed)
        .min(QUEUE_CAPACITY as u64)
}

fn has_work(ch: &Channel) -> bool {
    ch.active == 1 && pending(ch) > 0
}

/// Simulates the GPU from `g.sim_time_ns` up to `now`.
pub fn advance(g: &mut GpuInner, now: u64, p: Params) {
    if g.sim_time_ns == 0 {
        g.sim_time_ns = now;
        g.slice_start_ns = now;
        return;
    }
    let mut any_work = false;
    for ch in g.channels.iter_mut() {
        // A corrupt count would replay phantom items forever: drop them.
        if ch.submitted < ch.completed || ch.submitted - ch.completed > QUEUE_CAPACITY as u64 {
            ch.completed = ch.submitted;
        }
        any_work |= has_work(ch);
    }
    if g.sim_time_ns > now.saturating_add(1_000_000_000) {
        // Time from another clock (a state file from elsewhere): restart.
        g.sim_time_ns = now;
        g.slice_start_ns = now;
        return;
    }
    if !any_work {
        // What the loop below would find at once, without looking again.
        if g.sim_time_ns < now {
            g.slice_owner_plus_one = 0;
        }
        g.sim_time_ns = now.max(g.sim_time_ns);
        return;
    }
    let mut t = g.sim_time_ns;
    let slice = p.timeslice_ns.max(1);
    while t < now {
        let owner = (g.slice_owner_plus_one as usize).checked_sub(1);
        let keep = owner.filter(|&o| {
            o < MAX_CHANNELS
                && has_work(&g.channels[o])
                && t < g.slice_start_ns.saturating_add(slice)
        });
        let pick = match keep {
            Some(o) => o,
            None => {
                let start = owner.map_or(0, |o| o + 1);
                let next = (0..MAX_CHANNELS)
                    .map(|i| (start + i) % MAX_CHANNELS)
                    .find(|&c| has_work(&g.channels[c]));
                match next {
                    Some(c) => {
                        g.slice_owner_plus_one = c as u32 + 1;
                        g.slice_start_ns = t;
                        c
                    }
                    None => {
                        // Idle until now.
                        g.slice_owner_plus_one = 0;
                        break;
                    }
                }
            }
        };
        // Slices only matter when another channel waits: alone, a channel
        // runs straight to now.
        let alone = !(0..MAX_CHANNELS).any(|c| c != pick && has_work(&g.channels[c]));
        let run_until = if alone {
            now
        } else {
            now.min(g.slice_start_ns.saturating_add(slice))
        };
        t = run_channel(g, pick, t, run_until, now);
        if !has_work(&g.channels[pick]) || t >= g.slice_start_ns.saturating_add(slice) {
            // Give up the slice; the search starts after this channel.
            g.slice_owner_plus_one = pick as u32 + 1;
            g.slice_start_ns = 0;
        }
    }
    g.sim_time_ns = now.max(g.sim_time_ns);
}

/// Runs channel `c` from `t` until `until` or until it runs dry; returns the
/// time reached.
fn run_channel(g: &mut GpuInner, c: usize, mut t: u64, until: u64, now: u64) -> u64 {
    while pending(&g.channels[c]) > 0 {
        let ch = &mut g.channels[c];
        let idx = ch.head as usize % QUEUE_CAPACITY;
        let item = ch.queue[idx];
        let kind = ItemKind::from_raw(item.kind);
        // Markers at the head complete at once, even when the slice is
        // used up: an event right after a kernel is done when the kernel is.
        if kind != ItemKind::Marker && t >= until {
            break;
        }
        let run = match kind {
            ItemKind::Marker => 0,
            _ => item.remaining_ns.min(until - t),
        };
        let left = item.remaining_ns.saturating_sub(run);
        let (start, end) = (t, t + run);
        t = end;
        if left == 0 || kind == ItemKind::Marker {
            let seq = ch.completed;
            if kind == ItemKind::Marker {
                ch.markers[(seq % MARKER_LOG as u64) as usize] = MarkerDone {
                    seq_plus_one: seq + 1,
                    time_ns: t,
                };
                if let Some(slot) = (item.event_slot_plus_one as usize).checked_sub(1) {
                    ch.event_times[slot % EVENT_SLOTS] = t.max(1);
                }
            }
            ch.queue[idx] = Item::default();
            ch.head = ((idx + 1) % QUEUE_CAPACITY) as u32;
            ch.completed = seq + 1;
        } else {
            ch.queue[idx].remaining_ns = left;
        }
        if run > 0 {
            record(g, c, kind, start, end, now);
        }
    }
    t
}

/// Adds `[start, end)` of `kind` work by channel `c` to the history
/// (only what falls in the history window ending at `now`).
fn record(g: &mut GpuInner, c: usize, kind: ItemKind, start: u64, end: u64, now: u64) {
    let horizon = (now / BUCKET_NS).saturating_sub(HISTORY_BUCKETS as u64 - 1) * BUCKET_NS;
    let mut t = start.max(horizon);
    while t < end {
        let epoch = t / BUCKET_NS;
        let bucket_end = (epoch + 1) * BUCKET_NS;
        let d = (end.min(bucket_end) - t) as u32;
        let b = bucket_mut(g, epoch);
        match kind {
            ItemKind::Kernel => {
                b.sm_ns = b.sm_ns.saturating_add(d);
                b.channel_sm_ns[c] = b.channel_sm_ns[c].saturating_add(d);
            }
            ItemKind::Copy => b.mem_ns = b.mem_ns.saturating_add(d),
            ItemKind::Marker => {}
        }
        t = end.min(bucket_end);
    }
}

fn bucket_mut(g: &mut GpuInner, epoch: u64) -> &mut Bucket {
    let b = &mut g.history[(epoch % HISTORY_BUCKETS as u64) as usize];
    if b.epoch != epoch {
        b.epoch = epoch;
        b.sm_ns = 0;
        b.mem_ns = 0;
        b.channel_sm_ns = [0; MAX_CHANNELS];
    }
    b
}

/// Sums each of `f(bucket)`'s `N` figures over `[t0, t1)`, pro rata at the
/// edges, in one walk of the history. Only buckets still in the history
/// count. A bucket holds activity up to the simulated time only, so it is
/// prorated over the part it covers.
fn sum_history<const N: usize>(
    g: &GpuInner,
    t0: u64,
    t1: u64,
    f: impl Fn(&Bucket) -> [u64; N],
) -> [u64; N] {
    let mut total = [0u128; N];
    if t1 <= t0 {
        return [0; N];
    }
    let oldest = (t1 / BUCKET_NS).saturating_sub(HISTORY_BUCKETS as u64 - 1);
    for epoch in (t0 / BUCKET_NS).max(oldest)..=(t1.saturating_sub(1) / BUCKET_NS) {
        let b = &g.history[(epoch % HISTORY_BUCKETS as u64) as usize];
        if b.epoch != epoch {
            continue;
        }
        let (bs, be) = (epoch * BUCKET_NS, (epoch + 1) * BUCKET_NS);
        let covered = be.min(g.sim_time_ns.max(bs + 1)) - bs;
        let overlap = be.min(t1).min(bs + covered) - bs.max(t0).min(bs + covered);
        for (t, v) in total.iter_mut().zip(f(b)) {
            *t += u128::from(v) * u128::from(overlap) / u128::from(covered);
        }
    }
    total.map(|t| t as u64)
}

/// Device activity over `[t0, t1)`.
pub fn busy(g: &GpuInner, t0: u64, t1: u64) -> Busy {
    let [sm_ns, mem_ns] = sum_history(g, t0, t1, |b| [u64::from(b.sm_ns), u64::from(b.mem_ns)]);
    Busy { sm_ns, mem_ns }
}

/// Kernel time of channel `c` over `[t0, t1)`.
pub fn channel_busy(g: &GpuInner, c: usize, t0: u64, t1: u64) -> u64 {
    let c = c % MAX_CHANNELS;
    sum_history(g, t0, t1, |b| [u64::from(b.channel_sm_ns[c])])[0]
}

/// Why an item could not be queued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueFull;

/// Queues an item on channel `c`; returns its sequence number.
/// Call [`advance`] first so the item starts no earlier than now.
pub fn enqueue(
    g: &mut GpuInner,
    c: usize,
    kind: ItemKind,
    ns: u64,
    p: Params,
) -> Result<u64, QueueFull> {
    let ch = &mut g.channels[c % MAX_CHANNELS];
    let depth = u64::from(p.queue_depth).clamp(1, QUEUE_CAPACITY as u64);
    let n = pending(ch);
    // Markers may use the ring's spare room so that a full queue can still
    // record an event.
    let limit = if kind == ItemKind::Marker {
        QUEUE_CAPACITY as u64
    } else {
        depth
    };
    if n >= limit {
        return Err(QueueFull);
    }
    let idx = (ch.head as u64 + n) % QUEUE_CAPACITY as u64;
    ch.queue[idx as usize] = Item {
        kind: kind as u32,
        event_slot_plus_one: 0,
        remaining_ns: if kind == ItemKind::Marker {
            0
        } else {
            ns.max(1)
        },
    };
    ch.completed = ch.submitted.saturating_sub(n);
    let seq = ch.submitted;
    ch.submitted = ch.submitted.wrapping_add(1);
    Ok(seq)
}

/// Queues a marker that will write its completion time into event slot
/// `slot` of channel `c` (cleared now).
pub fn enqueue_event(g: &mut GpuInner, c: usize, slot: usize, p: Params) -> Result<u64, QueueFull> {
    let seq = enqueue(g, c, ItemKind::Marker, 0, p)?;
    let ch = &mut g.channels[c % MAX_CHANNELS];
    let idx = ((ch.head as u64 + pending(ch) - 1) % QUEUE_CAPACITY as u64) as usize;
    ch.queue[idx].event_slot_plus_one = (slot % EVENT_SLOTS) as u32 + 1;
    ch.event_times[slot % EVENT_SLOTS] = 0;
    Ok(seq)
}

/// Completion time recorded in event slot `slot` (None while pending).
pub fn event_time(ch: &Channel, slot: usize) -> Option<u64> {
    Some(ch.event_times[slot % EVENT_SLOTS]).filter(|&t| t != 0)
}

/// Whether item `seq` of channel `c` has completed.
pub fn is_complete(ch: &Channel, seq: u64) -> bool {
    ch.completed > seq
}

/// Completion time of marker `seq`, if still remembered.
pub fn marker_time(ch: &Channel, seq: u64) -> Option<u64> {
    let m = ch.markers[(seq % MARKER_LOG as u64) as usize];
    (m.seq_plus_one == seq + 1 && ch.completed > seq).then_some(m.time_ns)
}

/// Work queued ahead of and including `seq` on the channel (ns): the
/// earliest the channel could finish it if it had the GPU to itself.
pub fn work_until(ch: &Channel, seq: u64) -> u64 {
    let n = pending(ch);
    let upto = seq.saturating_add(1).saturating_sub(ch.completed).min(n);
    (0..upto)
        .map(|i| ch.queue[((ch.head as u64 + i) % QUEUE_CAPACITY as u64) as usize].remaining_ns)
        .fold(0u64, u64::saturating_add)
}

/// Puts back what the rest of the simulator relies on after a holder of
/// the GPU lock died part-way through an update, when any subset of its
/// stores may have reached the state: a channel flag that is neither free
/// nor active counts as active (so the reap that follows the recovery
/// releases it when its owner is gone, instead of leaking the slot), queue
/// counters and indices are brought back in range, and a slice owner that
/// names no channel is dropped. Live channels keep their memory and work;
/// the dead holder's own channel is released by that reap.
pub fn repair(g: &mut GpuInner) {
    for ch in g.channels.iter_mut() {
        if ch.active > 1 {
            ch.active = 1;
        }
        if ch.submitted < ch.completed || ch.submitted - ch.completed > QUEUE_CAPACITY as u64 {
            ch.completed = ch.submitted;
        }
        ch.head %= QUEUE_CAPACITY as u32;
    }
    if g.slice_owner_plus_one as usize > MAX_CHANNELS {
        g.slice_owner_plus_one = 0;
    }
}

/// Drops a channel's work and history; used when its owner is gone.
pub fn clear_channel(g: &mut GpuInner, c: usize) {
    let c = c % MAX_CHANNELS;
    for b in g.history.iter_mut() {
        b.channel_sm_ns[c] = 0;
    }
    clear_queue(g, c);
}

/// Drops every channel and the whole history (a GPU reset).
pub fn clear_all(g: &mut GpuInner) {
    for c in 0..MAX_CHANNELS {
        clear_queue(g, c);
    }
    for b in g.history.iter_mut() {
        b.epoch = 0;
        b.sm_ns = 0;
        b.mem_ns = 0;
        b.channel_sm_ns = [0; MAX_CHANNELS];
    }
}

/// Frees channel `c` (`< MAX_CHANNELS`) and drops its work, leaving the
/// history alone.
fn clear_queue(g: &mut GpuInner, c: usize) {
    let ch = &mut g.channels[c];
    ch.active = 0;
    ch.owner = crate::layout::Owner::default();
    ch.token = 0;
    ch.contexts = 0;
    ch.mem_bytes = 0;
    ch.submitted = 0;
    ch.completed = 0;
    ch.head = 0;
    ch.queue = [Item::default(); QUEUE_CAPACITY];
    ch.markers = [MarkerDone::default(); MARKER_LOG];
    ch.event_times = [0; EVENT_SLOTS];
    if g.slice_owner_plus_one as usize == c + 1 {
        g.slice_owner_plus_one = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: Params = Params {
        timeslice_ns: 2_000_000,
        queue_depth: 1024,
    };
    const MS: u64 = 1_000_000;

    fn gpu() -> Box<GpuInner> {
        // SAFETY: GpuInner is plain old data that is valid when all-zero
        // (the state file is created that way).
        unsafe { Box::<GpuInner>::new_zeroed().assume_init() }
    }

    fn start(g: &mut GpuInner, c: &[usize], t: u64) {
        for &c in c {
            g.channels[c].active = 1;
        }
        advance(g, t, P);
    }

    #[test]
    fn a_lone_channel_runs_back_to_back() {
        let mut g = gpu();
        let t0 = 1_000 * MS;
        start(&mut g, &[0], t0);
        for _ in 0..10 {
            enqueue(&mut g, 0, ItemKind::Kernel, MS, P).unwrap();
        }
        advance(&mut g, t0 + 5 * MS + MS / 2, P);
        assert_eq!(g.channels[0].completed, 5);
        advance(&mut g, t0 + 20 * MS, P);
        assert_eq!(g.channels[0].completed, 10);
        let b = busy(&g, t0, t0 + 20 * MS);
        assert_eq!(b.sm_ns, 10 * MS);
        assert_eq!(channel_busy(&g, 0, t0, t0 + 20 * MS), 10 * MS);
    }

    #[test]
    fn contending_channels_share_time_equally() {
        let mut g = gpu();
        let t0 = 1_000 * MS;
        start(&mut g, &[3, 7], t0);
        for _ in 0..500 {
            enqueue(&mut g, 3, ItemKind::Kernel, 300_000, P).unwrap();
            enqueue(&mut g, 7, ItemKind::Kernel, 300_000, P).unwrap();
        }
        let t1 = t0 + 100 * MS;
        advance(&mut g, t1, P);
        let a = channel_busy(&g, 3, t0, t1);
        let b = channel_busy(&g, 7, t0, t1);
        assert_eq!(a + b, 100 * MS);
        assert!(a.abs_diff(b) <= 2 * MS, "{a} vs {b}");
    }

    #[test]
    fn long_kernels_are_preempted_at_slice_end() {
        let mut g = gpu();
        let t0 = 1_000 * MS;
        start(&mut g, &[0, 1], t0);
        enqueue(&mut g, 0, ItemKind::Kernel, 10 * MS, P).unwrap();
        enqueue(&mut g, 1, ItemKind::Kernel, MS, P).unwrap();
        // Channel 0 runs 2 ms, then channel 1 finishes its 1 ms kernel.
        advance(&mut g, t0 + 3 * MS, P);
        assert_eq!(g.channels[1].completed, 1);
        assert_eq!(g.channels[0].completed, 0);
        advance(&mut g, t0 + 11 * MS, P);
        assert_eq!(g.channels[0].completed, 1);
    }

    #[test]
    fn markers_record_completion_time() {
        let mut g = gpu();
        let t0 = 1_000 * MS;
        start(&mut g, &[0], t0);
        let a = enqueue(&mut g, 0, ItemKind::Marker, 0, P).unwrap();
        enqueue(&mut g, 0, ItemKind::Kernel, 4 * MS, P).unwrap();
        let b = enqueue(&mut g, 0, ItemKind::Marker, 0, P).unwrap();
        assert_eq!(work_until(&g.channels[0], b), 4 * MS);
        advance(&mut g, t0 + 10 * MS, P);
        let (ta, tb) = (
            marker_time(&g.channels[0], a).unwrap(),
            marker_time(&g.channels[0], b).unwrap(),
        );
        assert_eq!(tb - ta, 4 * MS);
    }

    #[test]
    fn queue_depth_bounds_pending_kernels() {
        let mut g = gpu();
        start(&mut g, &[0], 1_000 * MS);
        let p = Params {
            queue_depth: 4,
            ..P
        };
        for _ in 0..4 {
            enqueue(&mut g, 0, ItemKind::Kernel, MS, p).unwrap();
        }
        assert_eq!(enqueue(&mut g, 0, ItemKind::Kernel, MS, p), Err(QueueFull));
        // A marker still fits.
        enqueue(&mut g, 0, ItemKind::Marker, 0, p).unwrap();
    }

    #[test]
    fn idle_time_is_not_busy() {
        let mut g = gpu();
        let t0 = 1_000 * MS;
        start(&mut g, &[0], t0);
        enqueue(&mut g, 0, ItemKind::Kernel, MS, P).unwrap();
        advance(&mut g, t0 + 10 * MS, P);
        enqueue(&mut g, 0, ItemKind::Kernel, MS, P).unwrap();
        advance(&mut g, t0 + 20 * MS, P);
        assert_eq!(busy(&g, t0, t0 + 20 * MS).sm_ns, 2 * MS);
        // The second kernel started at t0+10ms, not when the first ended
        // (history has BUCKET_NS resolution).
        assert_eq!(busy(&g, t0 + 5 * MS, t0 + 10 * MS).sm_ns, 0);
        assert_eq!(busy(&g, t0 + 10 * MS, t0 + 15 * MS).sm_ns, MS);
    }

    #[test]
    fn copies_count_as_memory_activity() {
        let mut g = gpu();
        let t0 = 1_000 * MS;
        start(&mut g, &[0], t0);
        enqueue(&mut g, 0, ItemKind::Copy, 3 * MS, P).unwrap();
        advance(&mut g, t0 + 10 * MS, P);
        let b = busy(&g, t0, t0 + 10 * MS);
        assert_eq!((b.sm_ns, b.mem_ns), (0, 3 * MS));
    }

    #[test]
    fn an_event_after_a_kernel_ending_at_the_slice_end_is_not_late() {
        let mut g = gpu();
        let t0 = 1_000 * MS;
        start(&mut g, &[0, 1], t0);
        // Channel 0 keeps the GPU busy; channel 1: event, 2 ms kernel, event.
        for _ in 0..50 {
            enqueue(&mut g, 0, ItemKind::Kernel, MS, P).unwrap();
        }
        enqueue_event(&mut g, 1, 0, P).unwrap();
        enqueue(&mut g, 1, ItemKind::Kernel, 2 * MS, P).unwrap();
        enqueue_event(&mut g, 1, 1, P).unwrap();
        advance(&mut g, t0 + 20 * MS, P);
        let (a, b) = (
            event_time(&g.channels[1], 0).unwrap(),
            event_time(&g.channels[1], 1).unwrap(),
        );
        assert_eq!(b - a, 2 * MS);
    }

    #[test]
    fn event_times_survive_many_later_markers() {
        let mut g = gpu();
        let t0 = 1_000 * MS;
        start(&mut g, &[0], t0);
        enqueue_event(&mut g, 0, 7, P).unwrap();
        for _ in 0..300 {
            enqueue(&mut g, 0, ItemKind::Marker, 0, P).unwrap();
            enqueue(&mut g, 0, ItemKind::Kernel, 10_000, P).unwrap();
        }
        enqueue_event(&mut g, 0, 8, P).unwrap();
        advance(&mut g, t0 + 100 * MS, P);
        let (a, b) = (
            event_time(&g.channels[0], 7).unwrap(),
            event_time(&g.channels[0], 8).unwrap(),
        );
        assert_eq!(b - a, 300 * 10_000);
    }

    #[test]
    fn a_partly_filled_bucket_is_not_undercounted() {
        let mut g = gpu();
        let t0 = 1_000 * MS;
        start(&mut g, &[0], t0);
        enqueue(&mut g, 0, ItemKind::Kernel, 100 * MS, P).unwrap();
        // 13 ms in: the current bucket is 3/5 filled, all busy.
        let now = t0 + 13 * MS;
        advance(&mut g, now, P);
        assert_eq!(busy(&g, now - 5 * MS, now).sm_ns, 5 * MS);
        assert_eq!(busy(&g, now - 10 * MS, now).sm_ns, 10 * MS);
    }

    #[test]
    fn clearing_the_gpu_drops_channels_and_history() {
        let mut g = gpu();
        let t0 = 1_000 * MS;
        start(&mut g, &[0, 5], t0);
        enqueue(&mut g, 0, ItemKind::Kernel, 2 * MS, P).unwrap();
        enqueue(&mut g, 5, ItemKind::Copy, 20 * MS, P).unwrap();
        advance(&mut g, t0 + 10 * MS, P);
        clear_all(&mut g);
        for c in [0, 5] {
            assert_eq!(g.channels[c].active, 0);
            assert_eq!(pending(&g.channels[c]), 0);
        }
        assert_eq!(g.slice_owner_plus_one, 0);
        assert_eq!(busy(&g, t0, t0 + 10 * MS), Busy::default());
        assert_eq!(channel_busy(&g, 0, t0, t0 + 10 * MS), 0);
        assert!(g.history.iter().all(|b| b.epoch == 0));
    }

    #[test]
    fn repair_brings_a_half_written_gpu_back_in_range() {
        let mut g = gpu();
        g.channels[2].active = 7;
        g.channels[3].active = 1;
        g.channels[3].submitted = 5;
        g.channels[3].completed = 9;
        g.channels[3].head = 5000;
        g.channels[4].active = 1;
        g.channels[4].mem_bytes = 123;
        g.slice_owner_plus_one = MAX_CHANNELS as u32 + 1;
        repair(&mut g);
        assert_eq!(g.channels[2].active, 1, "released by the reap that follows");
        assert_eq!(pending(&g.channels[3]), 0);
        assert!((g.channels[3].head as usize) < QUEUE_CAPACITY);
        assert_eq!(
            g.channels[4].mem_bytes, 123,
            "a live channel keeps its memory"
        );
        assert_eq!(g.slice_owner_plus_one, 0);
    }

    #[test]
    fn corrupt_indices_do_not_panic() {
        let mut g = gpu();
        g.channels[0].active = 1;
        g.channels[0].head = u32::MAX;
        g.channels[0].submitted = u64::MAX;
        g.channels[0].completed = 3;
        g.slice_owner_plus_one = u32::MAX;
        advance(&mut g, 1_000 * MS, P);
        advance(&mut g, 1_010 * MS, P);
        let _ = work_until(&g.channels[0], u64::MAX);
        clear_channel(&mut g, 0);
        assert_eq!(pending(&g.channels[0]), 0);
    }
}
