//! Which containers a period visits: the quiet-container schedule, as
//! pure functions of the period's number and of what woke containers in
//! it (the tick reads NVML, the usage regions, the eBPF observer and the
//! policy, and asks this module).
//!
//! A visit in which nothing happened in a container ([`quiet`]) adds one
//! to its calm count; a visit in which anything happened resets it. After
//! [`CALM_PERIODS`] calm visits in a row the container is quiet
//! ([`Schedule::quiet`]): it is not visited before its next period
//! ([`Schedule::after_visit`]: a [`Revisit`] interval on, at least one
//! period), unless it is woken ([`Schedule::due`]): a change of the
//! policy or of the set of processes NVML lists on the node
//! ([`process_set_changed`]) wakes every quiet container; NVML activity of
//! one of its processes ([`busy_pids`]), its launch counters moving or an
//! eBPF bypass report wakes that one (it is stirred); new metadata is
//! seen by the tick, which visits it too. Every [`Revisit`] interval the
//! container root is read afresh whatever the schedules say
//! ([`Revisit::forces_listing`]).

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use tessera_region::reader::UsageSnapshot;

use crate::control::sampling::SmSamples;
use crate::view::ContainerView;

use super::super::ebpf::Seen;

/// Visits in a row without activity before a container counts as quiet.
pub const CALM_PERIODS: u64 = 10;

/// How many periods a quiet container goes unvisited (at least one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Revisit(u64);

impl Revisit {
    /// The periods of length `period` in `interval` (`quiet_revisit`),
    /// at least one.
    pub(super) fn new(interval: Duration, period: Duration) -> Self {
        Self((interval.as_millis() / period.as_millis().max(1)).max(1) as u64)
    }

    /// The interval in periods.
    pub(super) fn periods(self) -> u64 {
        self.0
    }

    /// Whether the root is read afresh in `period`, whatever the
    /// containers' schedules say (every interval).
    pub(super) fn forces_listing(self, period: u64) -> bool {
        period.is_multiple_of(self.0)
    }
}

/// When a container is visited, as its last visit left it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Schedule {
    /// Visits in a row in which nothing happened.
    calm: u64,
    /// The period of the last visit that published (a revisit cut short
    /// because it found nothing new does not count).
    visited: u64,
    /// The period by which a quiet container is visited again.
    next: u64,
}

impl Schedule {
    /// The schedule after a visit in `period` that found the container
    /// calm ([`quiet`]) or not, `before` being the schedule its previous
    /// visit left (none: the first visit). A container becomes quiet with
    /// its [`CALM_PERIODS`]th calm visit in a row (so one woken up is
    /// followed every period for a while, and its controller learns from
    /// whole windows); `k`, its place in the period's listing, spreads the
    /// first revisits of containers that calmed down together over the
    /// interval.
    pub(super) fn after_visit(
        before: Option<&Self>,
        calm: bool,
        period: u64,
        k: usize,
        revisit: Revisit,
    ) -> Self {
        let calm = if calm {
            before.map_or(0, |s| s.calm) + 1
        } else {
            0
        };
        let next = if calm == CALM_PERIODS {
            period + 1 + k as u64 % revisit.0
        } else {
            period + revisit.0
        };
        Self {
            calm,
            visited: period,
            next,
        }
    }

    /// A quiet container's revisit in `period` found everything as its
    /// last visit did: it stays quiet, due again an interval on.
    pub(super) fn revisited_unchanged(&mut self, period: u64, revisit: Revisit) {
        self.next = period + revisit.0;
    }

    /// Nothing happened in it for [`CALM_PERIODS`] visits in a row: it
    /// may go unvisited.
    pub(super) fn quiet(&self) -> bool {
        self.calm >= CALM_PERIODS
    }

    /// Whether the container is visited in `period`: it is not quiet, its
    /// next period has come, everything is woken (`wake`: the policy or
    /// the set of NVML's processes changed) or it is `stirred` (NVML
    /// activity of its processes, its launch counters, an eBPF bypass
    /// report). (New metadata is the tick's to see.)
    pub(super) fn due(&self, period: u64, wake: bool, stirred: bool) -> bool {
        wake || stirred || !self.quiet() || period >= self.next
    }

    /// Whether a visit (with the same metadata and no bypass report) is
    /// only the revisit of a quiet container: nothing woke it.
    pub(super) fn only_revisit(&self, wake: bool, stirred: bool) -> bool {
        self.quiet() && !wake && !stirred
    }

    /// Whether periods went by since the last visit without one.
    pub(super) fn missed(&self, period: u64) -> bool {
        self.visited + 1 < period
    }
}

/// Whether nothing happened in a visited container since its previous
/// visit `before`: no kernel of its processes in NVML's samples, its
/// usage region readable, consistent and with the launch counters it had
/// then, no problem, no enforcement under way, the watchdog `settled` (no
/// finding pending, no incident open) and no bypass report. Only such a
/// container may go unvisited.
pub(super) fn quiet(
    v: &ContainerView,
    before: Option<&ContainerView>,
    usage: Option<&UsageSnapshot>,
    seen: Option<&Seen>,
    settled: bool,
) -> bool {
    let Some(before) = before else {
        return false;
    };
    let counters = |v: &ContainerView| {
        v.gpus
            .iter()
            .map(|g| (g.launches, g.warps, g.throttled_ns))
            .collect::<Vec<_>>()
    };
    settled
        && v.problems.is_empty()
        && v.enforcement.state == "running"
        && seen.is_none_or(|s| s.bypass.is_empty())
        && usage.is_some_and(|u| u.anomalies.is_empty())
        && v.gpus.iter().all(|g| g.sm_percent.is_none_or(|p| p <= 0.0))
        && counters(v) == counters(before)
}

/// Whether the set of processes NVML lists on the node (`now`, pid →
/// memory over all GPUs) differs from last period's (`before`): a new or
/// departed process wakes every quiet container.
pub(super) fn process_set_changed(now: &HashMap<u32, u64>, before: &HashMap<u32, u64>) -> bool {
    now.len() != before.len() || now.keys().any(|p| !before.contains_key(p))
}

/// The host processes NVML shows at work this period: running kernels
/// (SM samples above zero), or holding other memory than last period.
pub(super) fn busy_pids(
    sm: &HashMap<[u8; 16], SmSamples>,
    memory: &HashMap<u32, u64>,
    before: &HashMap<u32, u64>,
) -> BTreeSet<u32> {
    sm.values()
        .flat_map(|s| s.by_pid.iter())
        .filter(|(_, p)| **p > 0.0)
        .map(|(pid, _)| *pid)
        .chain(
            memory
                .iter()
                .filter(|(pid, b)| before.get(pid) != Some(b))
                .map(|(pid, _)| *pid),
        )
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const REVISIT: Revisit = Revisit(10);

    /// The schedule after `n` calm visits in a row, one a period from
    /// period 0 (the first visit is never calm: nothing to compare with).
    fn calmed(n: u64) -> (Schedule, u64) {
        let mut s = Schedule::after_visit(None, false, 0, 0, REVISIT);
        for p in 1..=n {
            s = Schedule::after_visit(Some(&s), true, p, 0, REVISIT);
        }
        (s, n)
    }

    #[test]
    fn quiet_after_calm_periods_calm_visits_in_a_row() {
        let (s, _) = calmed(CALM_PERIODS - 1);
        assert!(!s.quiet());
        let (s, _) = calmed(CALM_PERIODS);
        assert!(s.quiet());
        assert_eq!(s.calm, CALM_PERIODS);
        // One visit with activity among them starts the count again.
        let (s, p) = calmed(CALM_PERIODS - 1);
        let mut s = Schedule::after_visit(Some(&s), false, p + 1, 0, REVISIT);
        for n in 1..=CALM_PERIODS {
            assert!(!s.quiet(), "after {} calm visits", n - 1);
            s = Schedule::after_visit(Some(&s), true, p + 1 + n, 0, REVISIT);
        }
        assert!(s.quiet());
    }

    #[test]
    fn a_container_that_is_not_quiet_is_visited_every_period() {
        let (s, p) = calmed(CALM_PERIODS - 1);
        assert!(s.due(p + 1, false, false));
        let s = Schedule::after_visit(None, false, 0, 0, REVISIT);
        assert!(s.due(1, false, false));
    }

    #[test]
    fn a_quiet_container_is_skipped_until_its_next_period() {
        let (s, p) = calmed(CALM_PERIODS);
        // Becoming quiet with `k` = 0: due in the next period…
        assert_eq!(s.next, p + 1);
        // …and its place in the listing spreads the first revisits.
        let (before, _) = calmed(CALM_PERIODS - 1);
        let spread = Schedule::after_visit(Some(&before), true, p, 3, REVISIT);
        assert_eq!(spread.next, p + 1 + 3);
        for q in p + 1..p + 4 {
            assert!(!spread.due(q, false, false), "period {q}");
        }
        assert!(spread.due(p + 4, false, false));
        // A further calm visit: the next one a whole interval on.
        let s = Schedule::after_visit(Some(&s), true, p + 1, 0, REVISIT);
        assert!(s.quiet());
        for q in p + 2..p + 1 + REVISIT.periods() {
            assert!(!s.due(q, false, false), "period {q}");
        }
        assert!(s.due(p + 1 + REVISIT.periods(), false, false));
        assert!(s.due(p + 5 + REVISIT.periods(), false, false));
    }

    #[test]
    fn a_revisit_that_finds_nothing_new_keeps_it_quiet() {
        let (mut s, p) = calmed(CALM_PERIODS + 1);
        let at = p + REVISIT.periods();
        assert!(s.due(at, false, false));
        assert!(s.only_revisit(false, false));
        s.revisited_unchanged(at, REVISIT);
        assert!(s.quiet());
        assert!(!s.due(at + 1, false, false));
        assert!(s.due(at + REVISIT.periods(), false, false));
        // The visit before it is still the last that published.
        assert!(s.missed(at + 1));
    }

    #[test]
    fn wake_visits_every_quiet_container() {
        // (A policy change or a new or departed process on the node.)
        let (s, p) = calmed(CALM_PERIODS + 1);
        assert!(!s.due(p + 1, false, false));
        assert!(s.due(p + 1, true, false));
        assert!(!s.only_revisit(true, false));
        let before = HashMap::from([(1, 100), (2, 0)]);
        assert!(!process_set_changed(
            &HashMap::from([(1, 200), (2, 0)]),
            &before
        ));
        assert!(process_set_changed(&HashMap::from([(1, 100)]), &before));
        assert!(process_set_changed(
            &HashMap::from([(1, 100), (3, 0)]),
            &before
        ));
        assert!(process_set_changed(
            &HashMap::from([(1, 100), (2, 0), (3, 0)]),
            &before
        ));
    }

    #[test]
    fn a_stirred_container_is_visited() {
        let (s, p) = calmed(CALM_PERIODS + 1);
        assert!(s.due(p + 1, false, true));
        assert!(!s.only_revisit(false, true));
        // NVML activity of its pids: kernels, or memory that changed.
        let before = HashMap::from([(1, 100), (2, 100), (3, 100)]);
        let now = HashMap::from([(1, 100), (2, 200), (3, 100)]);
        let mut sm = SmSamples::default();
        sm.by_pid.insert(3, 12.0);
        sm.by_pid.insert(1, 0.0);
        let sm = HashMap::from([([0; 16], sm)]);
        assert_eq!(busy_pids(&sm, &now, &before), BTreeSet::from([2, 3]));
        assert!(busy_pids(&HashMap::new(), &before, &before).is_empty());
    }

    #[test]
    fn any_activity_resets_calm() {
        let (s, p) = calmed(CALM_PERIODS + 5);
        assert!(s.quiet());
        let s = Schedule::after_visit(Some(&s), false, p + 1, 0, REVISIT);
        assert_eq!(s.calm, 0);
        assert!(!s.quiet());
        assert!(s.due(p + 2, false, false));
    }

    /// A visited container's view: one GPU with `launches` counted and
    /// `sm` percent in NVML's samples.
    fn view(launches: u64, sm: Option<f64>) -> ContainerView {
        let meta: crate::containers::Metadata = serde_json::from_value(serde_json::json!({
            "version": 1, "sm_target": 50, "gpus": []
        }))
        .unwrap();
        ContainerView {
            id: "c".to_owned(),
            dir: "/c".into(),
            policy: crate::policy::Policy::default().effective(&meta),
            meta: std::sync::Arc::new(meta),
            epoch: 1,
            since_period: Some(0),
            gpus: vec![crate::view::GpuView {
                launches,
                sm_percent: sm,
                ..Default::default()
            }],
            processes: Vec::new(),
            problems: Vec::new(),
            ebpf: None,
            enforcement: crate::view::EnforcementView {
                state: "running".to_owned(),
                ..Default::default()
            },
        }
    }

    fn usage() -> UsageSnapshot {
        UsageSnapshot {
            slots: Vec::new(),
            used: Default::default(),
            buckets: Default::default(),
            anomalies: Vec::new(),
        }
    }

    #[test]
    fn a_visit_is_calm_only_when_nothing_happened() {
        let (before, u) = (view(5, None), usage());
        assert!(quiet(
            &view(5, Some(0.0)),
            Some(&before),
            Some(&u),
            None,
            true
        ));
        // The first visit has nothing to compare with.
        assert!(!quiet(&view(5, None), None, Some(&u), None, true));
        // Launches counted, kernels in NVML's samples, the watchdog not
        // settled, a problem, an unreadable or inconsistent usage region,
        // a bypass report, enforcement under way: activity.
        assert!(!quiet(&view(6, None), Some(&before), Some(&u), None, true));
        assert!(!quiet(
            &view(5, Some(3.0)),
            Some(&before),
            Some(&u),
            None,
            true
        ));
        assert!(!quiet(&view(5, None), Some(&before), Some(&u), None, false));
        let mut v = view(5, None);
        v.problems.push("usage region: unreadable".to_owned());
        assert!(!quiet(&v, Some(&before), Some(&u), None, true));
        assert!(!quiet(&view(5, None), Some(&before), None, None, true));
        let mut odd = usage();
        odd.anomalies.push("slot 3 out of range".to_owned());
        assert!(!quiet(
            &view(5, None),
            Some(&before),
            Some(&odd),
            None,
            true
        ));
        let seen = Seen {
            view: Default::default(),
            estimate_bytes: 0,
            bypass: vec![42],
        };
        assert!(!quiet(
            &view(5, None),
            Some(&before),
            Some(&u),
            Some(&seen),
            true
        ));
        let mut v = view(5, None);
        v.enforcement.state = "frozen".to_owned();
        assert!(!quiet(&v, Some(&before), Some(&u), None, true));
    }

    #[test]
    fn missed_periods_are_those_without_a_visit() {
        let s = Schedule::after_visit(None, false, 7, 0, REVISIT);
        assert!(!s.missed(7));
        assert!(!s.missed(8));
        assert!(s.missed(9));
    }

    #[test]
    fn the_revisit_interval_is_at_least_one_period() {
        let ms = Duration::from_millis;
        assert_eq!(Revisit::new(ms(1000), ms(100)).periods(), 10);
        assert_eq!(Revisit::new(ms(150), ms(100)).periods(), 1);
        assert_eq!(Revisit::new(ms(50), ms(100)).periods(), 1);
        assert_eq!(Revisit::new(ms(0), ms(0)).periods(), 1);
        // An interval of one period: a quiet container is visited every
        // period, and the root read every period.
        let one = Revisit::new(ms(100), ms(100));
        let mut s = Schedule::after_visit(None, false, 0, 0, one);
        for p in 1..=CALM_PERIODS + 1 {
            s = Schedule::after_visit(Some(&s), true, p, 5, one);
        }
        assert!(s.quiet());
        assert!(s.due(CALM_PERIODS + 2, false, false));
        assert!((0..5).all(|p| one.forces_listing(p)));
        let ten = Revisit::new(ms(1000), ms(100));
        let forced: Vec<u64> = (0..25).filter(|p| ten.forces_listing(*p)).collect();
        assert_eq!(forced, [0, 10, 20]);
    }
}
