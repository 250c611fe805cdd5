//! The agent's reader of a usage region: untrusted bytes in, a validated
//! snapshot out (invariant I3).
//!
//! It never maps the container's file into typed memory: it decodes
//! little-endian integers from a byte copy at the documented offsets, checks
//! every field's range and reports the first field out of range by name.
//! Oddities a racing but honest container can produce (a free slot that
//! still shows bytes for a moment) are listed as anomalies, not errors.

use crate::error::RegionError;
use crate::layout::{
    ABI_VERSION, MAX_GPUS, MAX_SLOTS, USAGE_MAGIC, USAGE_SIZE, owner, start, usage_offsets,
};

/// Largest byte count a slot may claim on one GPU (1 PiB).
pub const MAX_SLOT_BYTES: u64 = 1 << 50;
/// Largest pid Linux hands out.
pub const PID_MAX: u32 = 4_194_304;

/// State of a slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotState {
    /// Being claimed.
    Claiming,
    /// Owned by a live process (as far as the container knows).
    Active,
    /// Being reclaimed.
    Reclaiming,
}

/// One non-free slot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotView {
    /// Slot index.
    pub index: usize,
    /// State.
    pub state: SlotState,
    /// Pid (in the container's pid namespace).
    pub pid: u32,
    /// Start time (clock ticks after boot).
    pub start_time: u64,
    /// The tag of the pid namespace `pid` is counted in (0: not known;
    /// see [`crate::layout::start`]).
    pub ns_tag: u32,
    /// Bytes per GPU.
    pub used: [u64; MAX_GPUS],
    /// Launches per GPU.
    pub launches: [u64; MAX_GPUS],
}

/// One GPU's bucket counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BucketView {
    /// Launches admitted.
    pub launches: u64,
    /// Warps admitted.
    pub warps: u64,
    /// Time spent waiting for tokens (ns).
    pub throttled_ns: u64,
}

/// A validated usage region.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UsageSnapshot {
    /// Slots in use.
    pub slots: Vec<SlotView>,
    /// Bytes per GPU over all slots.
    pub used: [u64; MAX_GPUS],
    /// Launch counters per GPU.
    pub buckets: [BucketView; MAX_GPUS],
    /// Inconsistencies that do not make the region unusable.
    pub anomalies: Vec<String>,
}

fn u32_at(b: &[u8], off: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[off..off + 4]);
    u32::from_le_bytes(a)
}

fn u64_at(b: &[u8], off: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[off..off + 8]);
    u64::from_le_bytes(a)
}

fn bad(field: impl Into<String>, problem: impl Into<String>) -> RegionError {
    RegionError::field("usage", field, problem)
}

/// The part of a usage region a read decodes: the header, the buckets, the
/// owners and start times always; the byte counters of the first `gpus`
/// GPUs; the per-slot launch counters only if `slot_launches`.
///
/// The agent reads the GPUs a container is granted (its control region has
/// no others, so nothing charged beyond them can raise a limit) and no
/// per-slot launches (its controller reads the buckets): for a container
/// with one GPU that is a tenth of the file, and it is one contiguous
/// prefix of it ([`Scope::len`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Scope {
    /// GPUs whose byte counters are decoded (at most [`MAX_GPUS`]).
    pub gpus: usize,
    /// Whether the per-slot launch counters are decoded.
    pub slot_launches: bool,
}

impl Scope {
    /// Everything.
    pub const ALL: Self = Self {
        gpus: MAX_GPUS,
        slot_launches: true,
    };

    /// What the agent's loop needs of a container granted `gpus` GPUs.
    pub fn granted(gpus: usize) -> Self {
        Self {
            gpus: gpus.min(MAX_GPUS),
            slot_launches: false,
        }
    }

    /// Bytes from the start of the file this scope reads.
    pub fn len(&self) -> usize {
        if self.slot_launches {
            USAGE_SIZE
        } else {
            usage_offsets::USED + self.gpus.min(MAX_GPUS) * MAX_SLOTS * 8
        }
    }

    /// Whether the scope reads nothing past the fixed prefix.
    pub fn is_empty(&self) -> bool {
        self.gpus == 0 && !self.slot_launches
    }
}

/// Validates and decodes a whole usage region.
pub fn read_usage(b: &[u8]) -> Result<UsageSnapshot, RegionError> {
    read_usage_in(b, Scope::ALL)
}

/// Whether every byte of `b` is zero (word at a time, so it vectorises).
fn all_zero(b: &[u8]) -> bool {
    let words = b.chunks_exact(8);
    let tail = words.remainder().iter().fold(0u8, |a, &x| a | x);
    words.fold(0u64, |a, w| {
        let mut x = [0u8; 8];
        x.copy_from_slice(w);
        a | u64::from_ne_bytes(x)
    }) == 0
        && tail == 0
}

/// The launch counters of every GPU from the head of a usage region: `b`
/// holds at least [`usage_offsets::OWNERS`] bytes from the start of the
/// file (header and buckets), checked as [`read_usage_in`] checks them.
/// For a cheap look at whether a container launched anything.
pub fn read_buckets(b: &[u8]) -> Result<[BucketView; MAX_GPUS], RegionError> {
    if b.len() < usage_offsets::OWNERS {
        return Err(bad(
            "size",
            format!(
                "{} bytes read; the header and buckets take {}",
                b.len(),
                usage_offsets::OWNERS
            ),
        ));
    }
    if b[..8] != USAGE_MAGIC {
        return Err(bad("magic", "is not TSRUSE"));
    }
    let version = u32_at(b, 8);
    if version != ABI_VERSION {
        return Err(bad(
            "abi_version",
            format!("is {version}; expected {ABI_VERSION}"),
        ));
    }
    let size = u32_at(b, 12);
    if size as usize != USAGE_SIZE {
        return Err(bad("size", format!("is {size}; expected {USAGE_SIZE}")));
    }
    let mut buckets = [BucketView::default(); MAX_GPUS];
    for (g, v) in buckets.iter_mut().enumerate() {
        let off = usage_offsets::BUCKETS + g * 64;
        *v = BucketView {
            launches: u64_at(b, off + 16),
            warps: u64_at(b, off + 24),
            throttled_ns: u64_at(b, off + 32),
        };
    }
    Ok(buckets)
}

/// Validates and decodes the part of a usage region `scope` names; `b`
/// holds at least [`Scope::len`] bytes from the start of the file (the
/// header's size field must still say the whole region's size). Counters
/// outside the scope read as zero. Within the scope the checks are those
/// of [`read_usage`], in the same order, so the same field is named.
pub fn read_usage_in(b: &[u8], scope: Scope) -> Result<UsageSnapshot, RegionError> {
    let gpus = scope.gpus.min(MAX_GPUS);
    let need = scope.len();
    if b.len() < need {
        return Err(bad(
            "size",
            format!("file is {} bytes; expected {USAGE_SIZE}", b.len()),
        ));
    }
    let buckets = read_buckets(b)?;
    let slots = u32_at(b, 16);
    if slots as usize != MAX_SLOTS {
        return Err(bad(
            "slot_count",
            format!("is {slots}; expected {MAX_SLOTS}"),
        ));
    }
    let used_at = |g: usize, i: usize| u64_at(b, usage_offsets::USED + (g * MAX_SLOTS + i) * 8);
    let launches_at =
        |g: usize, i: usize| u64_at(b, usage_offsets::LAUNCHES + (g * MAX_SLOTS + i) * 8);
    let mut views = Vec::new();
    let mut totals = [0u64; MAX_GPUS];
    let mut anomalies = Vec::new();
    // Most slots of most containers are free and hold nothing: when no
    // byte counter in scope is set, a free slot needs no further look.
    let no_bytes = all_zero(&b[usage_offsets::USED..usage_offsets::USED + gpus * MAX_SLOTS * 8]);
    for i in 0..MAX_SLOTS {
        let w = u64_at(b, usage_offsets::OWNERS + i * 8);
        let (state, pid) = (owner::state(w), owner::pid(w));
        if w == 0 && no_bytes {
            continue;
        }
        let state = match state {
            owner::FREE => {
                if pid != 0 {
                    // A copy can tear the word of a slot being freed.
                    anomalies.push(format!("free slot {i} names pid {pid}"));
                }
                None
            }
            owner::CLAIMING => Some(SlotState::Claiming),
            owner::ACTIVE => Some(SlotState::Active),
            owner::RECLAIMING => Some(SlotState::Reclaiming),
            s => {
                return Err(bad(
                    format!("owners[{i}]"),
                    format!("has state {s}; accepted 0 to 3"),
                ));
            }
        };
        if pid > PID_MAX {
            return Err(bad(
                format!("owners[{i}]"),
                format!("names pid {pid}; accepted up to {PID_MAX}"),
            ));
        }
        let mut used = [0u64; MAX_GPUS];
        let mut launches = [0u64; MAX_GPUS];
        for g in 0..gpus {
            let u = used_at(g, i);
            if u > MAX_SLOT_BYTES {
                return Err(bad(
                    format!("used[{g}][{i}]"),
                    format!("is {u} bytes; accepted up to {MAX_SLOT_BYTES}"),
                ));
            }
            used[g] = u;
            if scope.slot_launches {
                launches[g] = launches_at(g, i);
            }
            // At most 256 slots of at most 2^50: no overflow.
            totals[g] += u;
        }
        match state {
            None => {
                if used.iter().any(|&u| u != 0) {
                    anomalies.push(format!("free slot {i} still holds bytes"));
                }
            }
            Some(state) => views.push(SlotView {
                index: i,
                state,
                pid,
                start_time: start::ticks(u64_at(b, usage_offsets::START_TIMES + i * 8)),
                ns_tag: start::tag(u64_at(b, usage_offsets::START_TIMES + i * 8)),
                used,
                launches,
            }),
        }
    }
    Ok(UsageSnapshot {
        slots: views,
        used: totals,
        buckets,
        anomalies,
    })
}
