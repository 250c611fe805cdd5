//! The watchdog: the agent's ground truth (NVML per-process memory, the
//! cgroup's members, the eBPF observer) held against each container's
//! limits and its own usage region, every control period, and the
//! policy's action on what breaks them.
//!
//! - [`detect`]: what is looked for (memory overage, bypass, tampering,
//!   and through [`compute`] compute overage);
//! - [`actions`]: alert, deny, freeze, kill, and the state they leave in
//!   the kernel; [`throttle`]: the throttle, which holds a compute
//!   overage to the cap;
//! - [`settings`]: the `[watchdog]` settings.
//!
//! **Incidents.** A finding must hold in [`CONFIRM_PERIODS`] consecutive
//! periods (so a read that raced a process's registration or exit is not
//! one); then it opens an incident of its reason, and the action applies
//! once. The incident lasts while the finding does and closes after
//! [`CLOSE_PERIODS`] periods without it; an action undone by an operator
//! (thawed, allowed) closes it too, so a container still breaking its
//! limit gets the action again. A kill whose finding outlives it by
//! [`KILL_REPEAT`] is repeated (a process forked past the SIGKILL
//! fallback). Tampering gets the policy's bypass action: both mean the
//! interposer's account cannot be trusted. A throttle is not an action
//! taken once: it runs every period while its incident is open, and the
//! incident ends when the throttle lets go (or gives up and kills),
//! not when the finding stops (the throttle is what stops it).
//!
//! A container without a cgroup in its metadata can only be alerted on:
//! without a cgroup the agent knows its processes only from the usage
//! region the container itself writes. A process that is in no managed
//! container's cgroup is never the watchdog's business.

pub mod actions;
pub mod compute;
pub mod detect;
pub mod settings;
pub mod throttle;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::time::{Duration, Instant};

use crate::containers::{ContainerId, Metadata};
use crate::error_chain::with_causes;
use crate::policy::{Action, Effective};
use crate::view::{ActionCount, EnforcementView, Reason};

pub use actions::{ActionError, Deny};
pub use compute::Compute;
pub use detect::{Facts, Finding, GpuMemory};
pub use settings::{EbpfSetting, WatchdogFile, WatchdogSettings};

/// Consecutive periods a finding must hold before it is acted on.
pub const CONFIRM_PERIODS: u32 = 2;
/// Periods without the finding that close an incident.
pub const CLOSE_PERIODS: u32 = 5;
/// A kill whose finding outlives it this long is repeated.
pub const KILL_REPEAT: Duration = Duration::from_secs(1);

/// An open incident.
#[derive(Clone, Debug)]
struct Incident {
    action: Action,
    at: Instant,
    absent: u32,
}

/// The watchdog's state of one container.
#[derive(Debug, Default)]
struct Watch {
    memory: detect::Memory,
    seen: BTreeMap<Reason, u32>,
    open: BTreeMap<Reason, Incident>,
    counts: BTreeMap<(Reason, Action), u64>,
    last_event: Option<String>,
    /// The running throttle, if one.
    throttle: Option<throttle::Throttle>,
    /// When the throttle last stepped.
    throttle_at: Option<Instant>,
    /// When it last stepped with NVML's measurements (what the next
    /// measurement covers from).
    measured_at: Option<Instant>,
    /// The throttle's current slice (a slice's timer freezes only while
    /// it is still current).
    slice: Arc<AtomicU64>,
}

/// Who a container is, for logs.
struct Names<'a>(&'a ContainerId, &'a Metadata);

impl std::fmt::Display for Names<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let m = self.1;
        write!(
            f,
            "container {} (pod {}/{}, container {})",
            self.0,
            m.namespace.as_deref().unwrap_or("-"),
            m.pod.as_deref().unwrap_or("-"),
            m.container.as_deref().unwrap_or("-")
        )
    }
}

/// The watchdog of every managed container.
#[derive(Debug)]
pub struct Watchdog {
    settings: WatchdogSettings,
    deny: Result<Deny, String>,
    watches: HashMap<ContainerId, Watch>,
}

impl Watchdog {
    /// A watchdog with `settings`; the deny action is prepared here (it
    /// needs the guard object and the devices to guard).
    pub fn new(settings: WatchdogSettings) -> Self {
        let deny = deny_action(&settings).map_err(|e| with_causes(&e));
        if let Err(why) = &deny {
            tracing::info!(reason = %why, "the watchdog's deny action is unavailable (it alerts instead)");
        }
        Self {
            settings,
            deny,
            watches: HashMap::new(),
        }
    }

    /// Its settings.
    pub fn settings(&self) -> &WatchdogSettings {
        &self.settings
    }

    /// Forgets the containers for which `present` is false.
    pub fn retain(&mut self, present: impl Fn(&ContainerId) -> bool) {
        self.watches.retain(|id, w| {
            let keep = present(id);
            if !keep {
                // (A slice's timer of a container gone freezes nothing.)
                w.slice.fetch_add(1, AtomicOrdering::SeqCst);
            }
            keep
        });
    }

    /// Whether container `id` has no finding awaiting confirmation and no
    /// open incident (the daemon may then leave it unvisited while it is
    /// quiet: each of those needs the next periods' checks).
    pub fn settled(&self, id: &ContainerId) -> bool {
        self.watches
            .get(id)
            .is_none_or(|w| w.seen.is_empty() && w.open.is_empty())
    }

    /// One period of container `id` (cgroup directory `cgroup`, absolute):
    /// detect, act, and say what it did.
    pub fn check(
        &mut self,
        id: &ContainerId,
        cgroup: Option<&Path>,
        policy: &Effective,
        facts: &Facts<'_>,
    ) -> EnforcementView {
        // (Only a new agent can find a cgroup a stopped throttle left
        // frozen: looked at on its first check of the container.)
        let first = !self.watches.contains_key(id);
        let watch = self.watches.entry(id.clone()).or_default();
        let names = Names(id, facts.meta);
        if first && let Some(dir) = cgroup {
            thaw_orphan(dir, &names);
        }
        let findings = detect::findings(facts, &mut watch.memory);
        let denied = self.deny.as_ref().is_ok_and(|d| d.is_denied(id.as_str()));
        let frozen = cgroup.is_some_and(actions::is_frozen);
        // The harshest action of this period names the last event (the
        // first of equals).
        let mut harshest: Option<Action> = None;
        for reason in Reason::ALL {
            let found: Vec<&Finding> = findings.iter().filter(|f| f.reason == reason).collect();
            if found.is_empty() {
                watch.seen.remove(&reason);
                if let Some(i) = watch.open.get_mut(&reason) {
                    i.absent += 1;
                    // (A throttle's incident ends with the throttle.)
                    if i.absent >= CLOSE_PERIODS && i.action != Action::Throttle {
                        tracing::info!(container = %names, reason = reason.as_str(), "incident over");
                        watch.open.remove(&reason);
                    }
                }
                continue;
            }
            let seen = watch.seen.entry(reason).or_default();
            *seen = seen.saturating_add(1);
            if *seen < CONFIRM_PERIODS {
                continue;
            }
            if let Some(i) = watch.open.get_mut(&reason) {
                i.absent = 0;
                let undone = match i.action {
                    Action::Freeze => !frozen,
                    Action::Deny => !denied,
                    Action::Kill => i.at.elapsed() >= KILL_REPEAT,
                    Action::Alert | Action::Throttle => false,
                };
                if !undone {
                    continue;
                }
                watch.open.remove(&reason);
            }
            let wanted = match reason {
                Reason::MemoryOverage => policy.memory_overage_action,
                Reason::Bypass | Reason::Tampering => policy.bypass_action,
                Reason::ComputeOverage => policy.compute_overage_action,
            };
            let what = found
                .iter()
                .map(|f| f.what.as_str())
                .collect::<Vec<_>>()
                .join("; ");
            let gpu = found.iter().find_map(|f| f.gpu.clone());
            let mut pids: Vec<u32> = found.iter().flat_map(|f| f.pids.iter().copied()).collect();
            pids.sort_unstable();
            pids.dedup();
            let started = Instant::now();
            let (taken, note) = match apply(wanted, id, cgroup, &self.deny, &pids) {
                Ok(how) => (
                    wanted,
                    format!("{how} in {} ms", started.elapsed().as_millis()),
                ),
                Err(e) => (
                    Action::Alert,
                    format!("{wanted} failed: {}", with_causes(&e)),
                ),
            };
            if taken == wanted {
                tracing::warn!(
                    container = %names,
                    gpu = gpu.as_deref().unwrap_or("-"),
                    reason = reason.as_str(),
                    action = %taken,
                    how = %note,
                    seen = %what,
                    "watchdog acted"
                );
            } else {
                tracing::error!(
                    container = %names,
                    gpu = gpu.as_deref().unwrap_or("-"),
                    reason = reason.as_str(),
                    action = %taken,
                    problem = %note,
                    seen = %what,
                    "watchdog could only alert"
                );
            }
            if taken == Action::Throttle {
                watch.throttle.get_or_insert_default();
            }
            *watch.counts.entry((reason, taken)).or_default() += 1;
            if harshest.is_none_or(|h| taken > h) {
                harshest = Some(taken);
                watch.last_event = Some(format!(
                    "{}: {} on {}: {what} ({note})",
                    taken,
                    reason.as_str(),
                    gpu.as_deref().unwrap_or("no GPU")
                ));
            }
            watch.open.insert(
                reason,
                Incident {
                    action: taken,
                    at: Instant::now(),
                    absent: 0,
                },
            );
        }
        if watch.throttle.is_some() {
            step_throttle(watch, cgroup, facts, &names);
        }
        let denied = self.deny.as_ref().is_ok_and(|d| d.is_denied(id.as_str()));
        let frozen = cgroup.is_some_and(actions::is_frozen);
        let killed = watch.open.values().any(|i| i.action == Action::Kill);
        let held = watch.open.values().any(|i| i.action == Action::Freeze);
        let state = if watch.throttle.is_some() && !held && !killed {
            "throttled"
        } else if frozen {
            "frozen"
        } else if killed {
            "killed"
        } else if denied {
            "denied"
        } else {
            "running"
        };
        EnforcementView {
            state: state.to_owned(),
            actions: watch
                .counts
                .iter()
                .map(|(&(reason, action), &count)| ActionCount {
                    reason,
                    action,
                    count,
                })
                .collect(),
            last_event: watch.last_event.clone(),
        }
    }
}

fn apply(
    action: Action,
    id: &ContainerId,
    cgroup: Option<&Path>,
    deny: &Result<Deny, String>,
    pids: &[u32],
) -> Result<String, ActionError> {
    if action == Action::Alert {
        return Ok("logged and counted".to_owned());
    }
    let dir = cgroup.ok_or(ActionError::NoCgroup)?;
    match action {
        Action::Alert => unreachable!("handled above"),
        Action::Deny => {
            let d = deny.as_ref().map_err(|e| ActionError::NoGuard(e.clone()))?;
            d.deny(id.as_str(), dir)?;
            Ok(format!("GPU device opens denied for {}", dir.display()))
        }
        Action::Throttle => Ok(format!(
            "{} throttled: frozen in the periods it owes GPU time",
            dir.display()
        )),
        Action::Freeze => {
            actions::freeze(dir)?;
            // The freeze action's now, not the throttle's: a new agent
            // must not thaw it.
            throttle::unmark(dir)?;
            Ok(format!("{} frozen", dir.display()))
        }
        Action::Kill => {
            let mut all = crate::containers::pids::cgroup_pids(dir).unwrap_or_default();
            all.extend_from_slice(pids);
            let how = actions::kill(dir, &all)?;
            Ok(format!("{} killed ({how})", dir.display()))
        }
    }
}

/// Thaws cgroup `dir` if a throttle froze it (a previous agent's, stopped
/// mid-throttle; this one has not checked the container before).
fn thaw_orphan(dir: &Path, names: &Names<'_>) {
    if !throttle::marked(dir) {
        return;
    }
    match throttle::thaw(dir, true) {
        Ok(()) => {
            tracing::info!(container = %names, cgroup = %dir.display(), "thawed a cgroup that a stopped throttle left frozen")
        }
        Err(e) => {
            tracing::warn!(container = %names, error = %with_causes(&e), "cannot thaw a cgroup a stopped throttle left frozen")
        }
    }
}

/// One period of the throttle of `watch`'s container: freeze, thaw (for a
/// slice, frozen again by a timer), let go, or give up and kill (see
/// [`throttle`]). A cgroup frozen by the freeze action is left as it is.
fn step_throttle(watch: &mut Watch, cgroup: Option<&Path>, facts: &Facts<'_>, names: &Names<'_>) {
    let (Some(t), Some(dir)) = (watch.throttle.as_mut(), cgroup) else {
        return;
    };
    let since = |at: Option<Instant>| {
        at.map_or(crate::control::PERIOD, |at| {
            facts.now.saturating_duration_since(at)
        })
    };
    let dt = since(watch.throttle_at);
    watch.throttle_at = Some(facts.now);
    let gpus: Vec<(usize, f64, f64)> = facts
        .compute
        .iter()
        .enumerate()
        .filter_map(|(i, c)| Some((i, c.measured?, c.cap?)))
        .collect();
    let covered = since(watch.measured_at);
    if !gpus.is_empty() {
        watch.measured_at = Some(facts.now);
    }
    let step = t.step(&gpus, covered, dt);
    // Whatever happens now, a slice's timer from an earlier period must
    // not freeze after it.
    let slice = watch.slice.fetch_add(1, AtomicOrdering::SeqCst) + 1;
    if watch.open.values().any(|i| i.action == Action::Freeze) {
        return;
    }
    let done = match step {
        throttle::Step::Freeze => throttle::freeze(dir),
        throttle::Step::Thaw(None) => throttle::thaw(dir, false),
        throttle::Step::Thaw(Some(d)) => throttle::thaw(dir, false).map(|()| {
            let (dir, current) = (dir.to_owned(), watch.slice.clone());
            std::thread::spawn(move || {
                std::thread::sleep(d);
                if current.load(AtomicOrdering::SeqCst) == slice {
                    let _ = throttle::freeze(&dir);
                }
            });
        }),
        throttle::Step::Release => {
            watch.throttle = None;
            watch.throttle_at = None;
            watch.measured_at = None;
            watch.open.remove(&Reason::ComputeOverage);
            tracing::info!(container = %names, "throttle released: nothing owed for {} periods", throttle::RELEASE_AFTER);
            throttle::thaw(dir, true)
        }
        throttle::Step::Escalate => {
            escalate(watch, dir, names);
            Ok(())
        }
    };
    if let Err(e) = done {
        tracing::warn!(container = %names, error = %with_causes(&e), "the throttle could not act on the cgroup");
    }
}

/// The throttle of `watch`'s container gives up (its GPU work outruns
/// the freezes): its cgroup `dir` is killed, and the incident is the
/// kill's.
fn escalate(watch: &mut Watch, dir: &Path, names: &Names<'_>) {
    watch.throttle = None;
    watch.throttle_at = None;
    watch.measured_at = None;
    let all = crate::containers::pids::cgroup_pids(dir).unwrap_or_default();
    let what = format!(
        "its GPU work outran the throttle: above cap + {} pp through {} periods frozen throughout (queued or long-running kernels)",
        compute::MARGIN_PP,
        throttle::ESCALATE_AFTER
    );
    // (A frozen cgroup is killed too: SIGKILL wakes frozen tasks.)
    let (taken, note) = match actions::kill(dir, &all) {
        Ok(how) => (Action::Kill, format!("{} killed ({how})", dir.display())),
        Err(e) => (Action::Alert, format!("kill failed: {}", with_causes(&e))),
    };
    if let Err(e) = throttle::thaw(dir, true) {
        tracing::warn!(container = %names, error = %with_causes(&e), "cannot thaw the throttled cgroup");
    }
    tracing::warn!(container = %names, reason = Reason::ComputeOverage.as_str(), action = %taken, how = %note, seen = %what, "watchdog acted");
    *watch
        .counts
        .entry((Reason::ComputeOverage, taken))
        .or_default() += 1;
    watch.last_event = Some(format!("{taken}: compute_overage: {what} ({note})"));
    watch.open.insert(
        Reason::ComputeOverage,
        Incident {
            action: taken,
            at: Instant::now(),
            absent: 0,
        },
    );
}

/// The deny action of `settings`.
pub fn deny_action(settings: &WatchdogSettings) -> Result<Deny, ActionError> {
    let devices = settings
        .resolve_devices()
        .map_err(|e| ActionError::NoGuard(format!("no devices to guard: {}", with_causes(&e))))?;
    let guarded = if settings.devices.is_empty() {
        let text = std::fs::read_to_string("/proc/devices").unwrap_or_default();
        let major = |name| crate::ebpf::devices::char_major(&text, name);
        crate::ebpf::GuardDevices::nvidia(major("nvidia-uvm"), major("nvidia-caps"))
    } else {
        crate::ebpf::GuardDevices::from_devices(&devices)
    };
    Deny::new(&settings.guard_object, guarded, &settings.deny_pin_dir)
}

/// The absolute cgroup directory of a container's metadata cgroup path.
pub fn cgroup_dir(root: &Path, rel: &str) -> PathBuf {
    root.join(rel.trim_start_matches('/'))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use tessera_region::layout::UNLIMITED;

    use super::*;
    use crate::containers::pids::{ProcessView, Source};
    use crate::control::Mode;

    const MIB: u64 = 1 << 20;

    fn meta() -> Metadata {
        serde_json::from_value(serde_json::json!({
            "version": 1, "sm_target": 50,
            "gpus": [{"uuid": "GPU-12345678-9abc-def0-0123-456789abcdef",
                      "memory_limit_bytes": 100 * MIB}]
        }))
        .unwrap()
    }

    fn policy(memory: Action) -> Effective {
        Effective {
            mode: Mode::Hard,
            priority: 0,
            bypass_action: Action::Alert,
            memory_overage_action: memory,
            compute_overage_action: Action::Throttle,
            rule: None,
        }
    }

    /// One period in which pid 10 (registered in slot 0, which accounts
    /// nothing) holds `bytes` on the GPU.
    fn period(w: &mut Watchdog, m: &Metadata, p: &Effective, bytes: u64) -> EnforcementView {
        period_with(w, m, p, bytes, Compute::default(), Instant::now())
    }

    /// The same, with the GPU's share and cap `compute`.
    fn period_with(
        w: &mut Watchdog,
        m: &Metadata,
        p: &Effective,
        bytes: u64,
        compute: Compute,
        now: Instant,
    ) -> EnforcementView {
        let procs = [ProcessView {
            host_pid: Some(10),
            ns_pid: 10,
            slot: Some(0),
            source: Source::Registered,
        }];
        let nvml = HashMap::from([(m.uuids()[0], GpuMemory::from([(10, bytes)]))]);
        let facts = Facts {
            meta: m,
            processes: &procs,
            usage: None,
            usage_raw: None,
            control_epoch: 2,
            launch_rates: &[UNLIMITED],
            launch_bursts: &[0],
            now,
            nvml: &nvml,
            ebpf_bypass: &[],
            context_allowance: 1000 * MIB,
            compute: &[compute],
        };
        let id = ContainerId::new("c").unwrap();
        w.check(&id, None, p, &facts)
    }

    fn count(v: &EnforcementView, reason: Reason, action: Action) -> u64 {
        v.actions
            .iter()
            .find(|a| a.reason == reason && a.action == action)
            .map_or(0, |a| a.count)
    }

    #[test]
    fn one_action_per_incident_after_confirmation() {
        let mut w = Watchdog::new(WatchdogSettings::default());
        let (m, p) = (meta(), policy(Action::Alert));
        // 1100 MiB against 100 + 1000 allowed: over.
        let v = period(&mut w, &m, &p, 1200 * MIB);
        assert_eq!(
            count(&v, Reason::MemoryOverage, Action::Alert),
            0,
            "not yet confirmed"
        );
        for _ in 0..10 {
            let v = period(&mut w, &m, &p, 1200 * MIB);
            assert_eq!(count(&v, Reason::MemoryOverage, Action::Alert), 1, "{v:?}");
        }
        // Under the limit long enough to close the incident; a new one is
        // a new action.
        for _ in 0..CLOSE_PERIODS {
            period(&mut w, &m, &p, 50 * MIB);
        }
        period(&mut w, &m, &p, 1200 * MIB);
        let v = period(&mut w, &m, &p, 1200 * MIB);
        assert_eq!(count(&v, Reason::MemoryOverage, Action::Alert), 2, "{v:?}");
        assert_eq!(v.state, "running");
    }

    #[test]
    fn a_share_over_the_cap_is_a_compute_overage_for_the_policy() {
        let m = meta();
        let over = Compute {
            measured: Some(80.0),
            cap: Some(20.0),
        };
        let honest = Compute {
            measured: Some(22.0),
            cap: Some(20.0),
        };
        let mut w = Watchdog::new(WatchdogSettings::default());
        let p = policy(Action::Kill);
        let t0 = Instant::now();
        let at = |k: u32| t0 + crate::control::PERIOD * k;
        for k in 0..20 {
            let v = period_with(&mut w, &m, &p, 0, honest, at(k));
            assert!(v.actions.is_empty(), "{v:?}");
        }
        // Found once its excess spent its credit and passed the
        // tolerance, and confirmed (2 periods); without a cgroup the
        // throttle can only alert.
        let mut seen = Vec::new();
        for k in 20..30 {
            seen.push(count(
                &period_with(&mut w, &m, &p, 0, over, at(k)),
                Reason::ComputeOverage,
                Action::Alert,
            ));
        }
        assert!(seen.contains(&1), "{seen:?}");
        let v = period_with(&mut w, &m, &p, 0, over, at(30));
        let last = v.last_event.unwrap();
        assert!(
            last.contains("throttle failed") && last.contains("no cgroup"),
            "{last}"
        );
        assert!(last.contains("compute_overage"), "{last}");
    }

    #[test]
    fn without_a_cgroup_only_an_alert_is_possible() {
        let mut w = Watchdog::new(WatchdogSettings::default());
        let (m, p) = (meta(), policy(Action::Kill));
        period(&mut w, &m, &p, 1200 * MIB);
        let v = period(&mut w, &m, &p, 1200 * MIB);
        assert_eq!(count(&v, Reason::MemoryOverage, Action::Kill), 0, "{v:?}");
        assert_eq!(count(&v, Reason::MemoryOverage, Action::Alert), 1, "{v:?}");
        let last = v.last_event.unwrap();
        assert!(
            last.contains("kill failed") && last.contains("no cgroup"),
            "{last}"
        );
    }
}
