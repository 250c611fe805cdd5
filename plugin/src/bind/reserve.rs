//! The in-process reservation table: what every pod this scheduler knows
//! to hold GPU shares (bound, or being bound right now) takes of each GPU.
//!
//! **Invariant** (enforced by [`Reservations::reserve`] alone, under the
//! locks of exactly the GPUs it changes): on every GPU, the holders' memory
//! sums to at most the card's memory, their SM percent to at most 100, and
//! their count to at most [`Reservations::max_shares`]. A bind reserves
//! *before* it writes anything to the API server, so two binds racing for
//! one GPU cannot both write an assignment that over-commits it: the
//! second one's check sees the first one's reservation and places again.
//!
//! There is no node-wide lock: each GPU has its own mutex; a pod's GPUs are
//! locked in UUID order (so two pods never deadlock) for the check and the
//! insert only, never across an API call. Placement itself runs on a
//! snapshot and is re-checked at commit (optimistic: a lost race re-places).
//!
//! Entries are stamped with the epoch they were made in. [`Reservations::rebuild`]
//! replaces the table with what the API server says is bound, keeping
//! entries still pending (a bind in flight) and those made after the
//! listing began, so a refresh never forgets a bind that raced it; a pod
//! that ended or was deleted drops out at the next refresh.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};

use crate::extender::{ClusterView, NodeView, Unfit, place};
use crate::placement::Workload;
use crate::request::PodRequest;

/// Shares per GPU when not configured (HAMi's `deviceSplitCount`).
pub const DEFAULT_MAX_SHARES: u32 = 10;
/// Placement attempts when other binds keep taking the chosen GPUs.
const MAX_PLACE_ATTEMPTS: usize = 16;

/// What one pod holds of one GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    /// Memory, MiB.
    pub mib: u64,
    /// SM percent.
    pub cores: u32,
    /// vGPU slots (one per container on this GPU).
    pub shares: u32,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    held: Held,
    epoch: u64,
    /// A bind is in flight: not yet confirmed by an API write.
    pending: bool,
}

#[derive(Debug, Default)]
struct Book {
    node: String,
    capacity_mib: u64,
    holders: BTreeMap<String, Entry>,
}

impl Book {
    fn used_except(&self, pod: &str) -> Held {
        let mut sum = Held {
            mib: 0,
            cores: 0,
            shares: 0,
        };
        for (uid, e) in &self.holders {
            if uid != pod {
                sum.mib = sum.mib.saturating_add(e.held.mib);
                sum.cores = sum.cores.saturating_add(e.held.cores);
                sum.shares = sum.shares.saturating_add(e.held.shares);
            }
        }
        sum
    }
}

/// One GPU's figures, for metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuUse {
    /// Node of the GPU.
    pub node: String,
    /// GPU UUID.
    pub uuid: String,
    /// Card memory, MiB.
    pub capacity_mib: u64,
    /// What the holders take.
    pub used: Held,
}

/// Why a reservation was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReserveError {
    /// The pod does not fit the node now (or ever).
    #[error("{0}")]
    NoFit(String),
    /// Other binds kept taking the GPUs chosen.
    #[error("the GPUs chosen kept being taken by concurrent binds ({0} attempts)")]
    Contended(usize),
}

/// The table; see the module docs.
#[derive(Debug)]
pub struct Reservations {
    max_shares: u32,
    gpus: RwLock<HashMap<String, Arc<Mutex<Book>>>>,
    epoch: AtomicU64,
    /// Bumped after every change of what is held ([`Self::version`]).
    changes: AtomicU64,
}

impl Default for Reservations {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_SHARES)
    }
}

fn lock(m: &Mutex<Book>) -> MutexGuard<'_, Book> {
    // A panic while holding a book leaves plain numbers; keep serving.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A reservation held by a bind in flight. Dropped while pending, it is
/// released; [`Reservation::confirm`] keeps it for good (the pod is bound).
#[derive(Debug)]
pub struct Reservation<'a> {
    table: &'a Reservations,
    pod: String,
    /// (container, GPU UUIDs) in pod order.
    pub containers: Vec<(String, Vec<String>)>,
    gpus: Vec<String>,
    armed: bool,
}

impl Reservation<'_> {
    /// The bind succeeded (or its write may have reached the API server):
    /// the entries stay, no longer pending.
    pub fn confirm(mut self) {
        self.armed = false;
        for uuid in &self.gpus {
            if let Some(book) = self.table.book(uuid) {
                let mut book = lock(&book);
                if let Some(e) = book.holders.get_mut(&self.pod) {
                    e.pending = false;
                }
            }
        }
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.table.release(&self.pod, &self.gpus);
        }
    }
}

impl Reservations {
    /// An empty table allowing `max_shares` shares per GPU (at least 1).
    pub fn new(max_shares: u32) -> Self {
        Self {
            max_shares: max_shares.max(1),
            gpus: RwLock::default(),
            epoch: AtomicU64::new(1),
            changes: AtomicU64::new(0),
        }
    }

    /// A number that changes after every change of what the table holds
    /// (a reservation made or released, a rebuild). Read it before
    /// [`Self::apply`]: a view derived then is current while the number
    /// stays the same.
    pub fn version(&self) -> u64 {
        self.changes.load(Ordering::SeqCst)
    }

    /// Shares allowed per GPU.
    pub fn max_shares(&self) -> u32 {
        self.max_shares
    }

    fn book(&self, uuid: &str) -> Option<Arc<Mutex<Book>>> {
        self.gpus
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(uuid)
            .cloned()
    }

    fn book_or_new(&self, uuid: &str) -> Arc<Mutex<Book>> {
        if let Some(b) = self.book(uuid) {
            return b;
        }
        self.gpus
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(uuid.to_owned())
            .or_default()
            .clone()
    }

    /// `node` as placement must see it for `pod`: each GPU's committed
    /// memory and cores are the larger of the telemetry's and the table's
    /// (the table counts bound pods the agent may not have reported yet;
    /// telemetry counts memory held outside any share). A GPU with no
    /// share slot left reads as full.
    fn effective(&self, node: &NodeView, pod: &str) -> NodeView {
        let mut node = node.clone();
        for g in &mut node.gpus {
            let Some(book) = self.book(&g.uuid) else {
                continue;
            };
            let used = lock(&book).used_except(pod);
            g.used_mib = g.used_mib.max(used.mib);
            g.cores_used_percent = g.cores_used_percent.max(used.cores);
            if used.shares >= self.max_shares {
                g.used_mib = g.memory_mib;
                g.cores_used_percent = 100;
            }
        }
        node
    }

    /// `view` as filter and prioritize must see it: every node with a GPU
    /// this table holds shares on is taken as [`Self::effective`] makes it
    /// (so a GPU bound full, or out of share slots, before the agent
    /// reports it reads as full). `None` when the table changes no node.
    pub fn apply(&self, view: &ClusterView) -> Option<ClusterView> {
        let held = |uuid: &str| {
            self.book(uuid)
                .is_some_and(|b| !lock(&b).holders.is_empty())
        };
        let changed: Vec<NodeView> = view
            .nodes()
            .filter(|n| n.gpus.iter().any(|g| held(&g.uuid)))
            .map(|n| self.effective(n, ""))
            .collect();
        (!changed.is_empty()).then(|| view.with_nodes(changed))
    }

    /// Places `request` on `node` (by its placement policy, against
    /// `workload` where that is fragmentation-aware) and reserves what it
    /// takes, as one pod `pod` (its UID). A reservation the same pod held before on these
    /// GPUs is replaced; one it held on other GPUs (a stale assignment
    /// from a bind that did not finish) stays until the next rebuild,
    /// which counts too much for a while, never too little.
    ///
    /// # Errors
    /// [`ReserveError::NoFit`] with the placement's reason, or
    /// [`ReserveError::Contended`] when concurrent binds kept winning.
    pub fn reserve(
        &self,
        pod: &str,
        node: &NodeView,
        request: &PodRequest,
        workload: &Workload,
    ) -> Result<Reservation<'_>, ReserveError> {
        for _ in 0..MAX_PLACE_ATTEMPTS {
            let view = self.effective(node, pod);
            let placed =
                place(&request.shares, &request.policy, workload, &view).map_err(|u| match u {
                    Unfit::Busy(r) => ReserveError::NoFit(r),
                    Unfit::Never(r) => {
                        ReserveError::NoFit(format!("{r} (even with the node empty)"))
                    }
                })?;
            let mut takes: BTreeMap<String, (u64, Held)> = BTreeMap::new();
            for (share, (_, uuids)) in request.shares.iter().zip(&placed.containers) {
                for uuid in uuids {
                    let capacity = node
                        .gpus
                        .iter()
                        .find(|g| &g.uuid == uuid)
                        .map_or(0, |g| g.memory_mib);
                    let t = takes.entry(uuid.clone()).or_insert((
                        capacity,
                        Held {
                            mib: 0,
                            cores: 0,
                            shares: 0,
                        },
                    ));
                    t.1.mib += share.effective_memory().mib_on(capacity);
                    t.1.cores += u32::from(share.effective_cores());
                    t.1.shares += 1;
                }
            }
            if self.commit(pod, &node.name, &takes, true) {
                return Ok(Reservation {
                    table: self,
                    pod: pod.to_owned(),
                    containers: placed.containers,
                    gpus: takes.into_keys().collect(),
                    armed: true,
                });
            }
        }
        Err(ReserveError::Contended(MAX_PLACE_ATTEMPTS))
    }

    /// Checks and inserts `takes` (GPU → (capacity, held)) under the GPUs'
    /// locks, taken in UUID order (`takes` is sorted). Here the invariant
    /// of the module docs is enforced: nothing is inserted unless every
    /// GPU stays within memory, cores and slots.
    fn commit(
        &self,
        pod: &str,
        node: &str,
        takes: &BTreeMap<String, (u64, Held)>,
        pending: bool,
    ) -> bool {
        let books: Vec<Arc<Mutex<Book>>> = takes.keys().map(|u| self.book_or_new(u)).collect();
        let mut guards: Vec<MutexGuard<'_, Book>> = books.iter().map(|b| lock(b)).collect();
        let epoch = self.epoch.load(Ordering::SeqCst);
        for (guard, (capacity, take)) in guards.iter_mut().zip(takes.values()) {
            guard.capacity_mib = *capacity;
            node.clone_into(&mut guard.node);
            let used = guard.used_except(pod);
            if used.mib.saturating_add(take.mib) > *capacity
                || used.cores.saturating_add(take.cores) > 100
                || used.shares.saturating_add(take.shares) > self.max_shares
            {
                return false;
            }
        }
        for (guard, (_, take)) in guards.iter_mut().zip(takes.values()) {
            guard.holders.insert(
                pod.to_owned(),
                Entry {
                    held: *take,
                    epoch,
                    pending,
                },
            );
        }
        self.changes.fetch_add(1, Ordering::SeqCst);
        true
    }

    /// Removes the pod's entries on `gpus`.
    pub fn release(&self, pod: &str, gpus: &[String]) {
        for uuid in gpus {
            if let Some(book) = self.book(uuid) {
                lock(&book).holders.remove(pod);
                self.changes.fetch_add(1, Ordering::SeqCst);
            }
        }
    }

    /// Starts a refresh: returns the epoch to hand to [`Self::rebuild`]
    /// once the API server's pods have been listed.
    pub fn begin_refresh(&self) -> u64 {
        self.epoch.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// Replaces the table with `bound` (pod UID, node, GPU UUID, card
    /// memory, what it holds), as listed after [`Self::begin_refresh`]
    /// returned `since`. Entries pending or made at `since` or later stay:
    /// the listing may have missed them. Listed holders are taken as they
    /// are, even beyond capacity (they are facts; new binds then find the
    /// GPU full).
    pub fn rebuild(&self, bound: Vec<(String, String, String, u64, Held)>, since: u64) {
        let mut listed: HashMap<String, Vec<(String, String, u64, Held)>> = HashMap::new();
        for (pod, node, uuid, capacity, held) in bound {
            listed
                .entry(uuid)
                .or_default()
                .push((pod, node, capacity, held));
        }
        let known: Vec<String> = self
            .gpus
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .keys()
            .cloned()
            .collect();
        for uuid in known.iter().chain(listed.keys()) {
            let book = self.book_or_new(uuid);
            let mut book = lock(&book);
            book.holders.retain(|_, e| e.pending || e.epoch >= since);
            for (pod, node, capacity, held) in listed.get(uuid).into_iter().flatten() {
                book.capacity_mib = *capacity;
                node.clone_into(&mut book.node);
                book.holders
                    .entry(pod.clone())
                    .and_modify(|e| e.held = *held)
                    .or_insert(Entry {
                        held: *held,
                        epoch: since - 1,
                        pending: false,
                    });
            }
        }
        self.changes.fetch_add(1, Ordering::SeqCst);
    }

    /// Every GPU's capacity and use, by UUID.
    pub fn snapshot(&self) -> Vec<GpuUse> {
        let books: Vec<(String, Arc<Mutex<Book>>)> = self
            .gpus
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let mut out: Vec<GpuUse> = books
            .into_iter()
            .map(|(uuid, book)| {
                let book = lock(&book);
                GpuUse {
                    node: book.node.clone(),
                    uuid,
                    capacity_mib: book.capacity_mib,
                    used: book.used_except(""),
                }
            })
            .collect();
        out.sort_by(|a, b| a.uuid.cmp(&b.uuid));
        out
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::tests_support::{node, request as asking};
    use super::*;

    fn request(mib: u64) -> PodRequest {
        asking(mib, 10)
    }

    #[test]
    fn a_dropped_reservation_is_released_and_a_confirmed_one_stays() {
        let t = Reservations::new(10);
        let r = t
            .reserve("p1", &node(), &request(600), &Workload::default())
            .unwrap();
        assert!(
            t.reserve("p2", &node(), &request(600), &Workload::default())
                .is_err()
        );
        drop(r);
        t.reserve("p2", &node(), &request(600), &Workload::default())
            .unwrap()
            .confirm();
        assert_eq!(t.snapshot()[0].used.mib, 600);
        let e = t
            .reserve("p3", &node(), &request(600), &Workload::default())
            .unwrap_err();
        assert!(matches!(e, ReserveError::NoFit(_)), "{e}");
    }

    #[test]
    fn rebuild_forgets_ended_pods_but_keeps_binds_in_flight() {
        let t = Reservations::new(10);
        t.reserve("gone", &node(), &request(300), &Workload::default())
            .unwrap()
            .confirm();
        let in_flight = t
            .reserve("flying", &node(), &request(300), &Workload::default())
            .unwrap();
        let since = t.begin_refresh();
        let held = Held {
            mib: 200,
            cores: 5,
            shares: 1,
        };
        t.rebuild(
            vec![("listed".into(), "n".into(), "GPU-a".into(), 1000, held)],
            since,
        );
        assert_eq!(t.snapshot()[0].used.mib, 500);
        drop(in_flight);
        assert_eq!(t.snapshot()[0].used.mib, 200);
    }

    #[test]
    fn slots_are_a_limit_of_their_own() {
        let t = Reservations::new(2);
        t.reserve("a", &node(), &request(1), &Workload::default())
            .unwrap()
            .confirm();
        t.reserve("b", &node(), &request(1), &Workload::default())
            .unwrap()
            .confirm();
        assert!(
            t.reserve("c", &node(), &request(1), &Workload::default())
                .is_err()
        );
    }
}

#[cfg(test)]
mod race {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::tests_support::{node, request};
    use super::*;

    /// Threads racing for one GPU: the reservations granted, tallied by
    /// the test from what each asked (not read from the table), never
    /// exceed the card, in any of many rounds.
    #[test]
    fn racing_threads_never_get_more_than_the_card() {
        let node = node();
        for round in 0..40 {
            let table = Reservations::new(u32::MAX);
            let granted = std::sync::atomic::AtomicU64::new(0);
            let start = std::sync::Barrier::new(8);
            std::thread::scope(|s| {
                for t in 0..8 {
                    let (table, granted, start, node) = (&table, &granted, &start, &node);
                    s.spawn(move || {
                        start.wait();
                        for i in 0..400 {
                            if let Ok(r) = table.reserve(
                                &format!("{t}-{i}"),
                                node,
                                &request(7, 0),
                                &Workload::default(),
                            ) {
                                r.confirm();
                                granted.fetch_add(7, Ordering::SeqCst);
                            }
                        }
                    });
                }
            });
            let granted = granted.load(Ordering::SeqCst);
            assert!(
                granted <= 1000,
                "round {round}: {granted} MiB granted of 1000"
            );
            assert!(
                granted > 1000 - 7,
                "round {round}: only {granted} MiB granted"
            );
        }
    }
}

#[cfg(test)]
mod tests_support {
    use crate::annotations::GpuPolicy;
    use crate::extender::{GpuView, NodeView};
    use crate::request::PodRequest;
    use crate::resources::{GpuShare, Memory};

    pub fn node() -> NodeView {
        NodeView {
            name: "n".into(),
            gpus: vec![GpuView {
                uuid: "GPU-a".into(),
                model: "m".into(),
                memory_mib: 1000,
                used_mib: 0,
                cores_used_percent: 0,
                healthy: true,
                ..GpuView::default()
            }],
            ..NodeView::default()
        }
    }

    pub fn request(mib: u64, cores: u8) -> PodRequest {
        PodRequest {
            shares: vec![GpuShare {
                container: "c".into(),
                count: 1,
                memory: Some(Memory::Mib(mib)),
                cores: Some(cores),
                priority: None,
            }],
            policy: GpuPolicy::default(),
        }
    }
}
