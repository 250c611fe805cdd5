//! The node policy: defaults plus rules matched by namespace
//! and pod labels, deciding each container's compute mode, priority and
//! what the watchdog does on a bypass, a memory overage or a compute
//! overage.
//!
//! - [`file`]: the YAML file (`deploy/examples/policy.yaml`), parsed and
//!   checked; every error names the file, line, column and field;
//! - [`reload`]: the daemon's hot reload (a stat per period, a re-read on
//!   any change, the previous policy kept while the file is bad or gone);
//!
//! How a container's [`Effective`] settings are decided
//! ([`Policy::effective`]), field by field:
//! 1. an explicit value in its metadata (mode, priority: in Kubernetes the
//!    pod's annotation) wins;
//! 2. else the first rule that matches the container, if it sets the
//!    field (a rule overrides only the fields it sets; rules after the
//!    first match are not consulted);
//! 3. else the policy's defaults (the built-in ones for fields the file's
//!    `defaults` leaves out).
//!
//! A rule matches when every criterion it gives matches: `namespaces` (the
//! container's namespace is one of them) and `podLabels` (the container
//! has every one of these labels with that value). A container without a
//! namespace (outside Kubernetes) matches only rules without a
//! `namespaces` criterion.

pub mod file;
pub mod reload;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::containers::Metadata;
use crate::control::Mode;

pub use file::{API_VERSION, KIND, PolicyError};
pub use reload::Reloader;

/// What the watchdog does to a container that broke a limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// Log and count it; nothing else.
    Alert,
    /// Deny the container's further opens of GPU devices (the cgroup
    /// device guard); handles it holds keep working.
    Deny,
    /// Hold the container to its compute cap by freezing its cgroup in
    /// the periods it owes GPU time (`watchdog::throttle`); a container
    /// the freezes cannot hold is killed. Compute overage only.
    Throttle,
    /// Freeze the container's cgroup (`cgroup.freeze`).
    Freeze,
    /// Kill every process of the container's cgroup (`cgroup.kill`).
    Kill,
}

impl Action {
    /// Every action, mildest first.
    pub const ALL: [Action; 5] = [
        Action::Alert,
        Action::Deny,
        Action::Throttle,
        Action::Freeze,
        Action::Kill,
    ];

    /// The name used in policy files, logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Alert => "alert",
            Action::Deny => "deny",
            Action::Throttle => "throttle",
            Action::Freeze => "freeze",
            Action::Kill => "kill",
        }
    }
}

impl std::fmt::Display for Action {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the policy decided for one container.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Effective {
    /// How its SM target is held.
    pub mode: Mode,
    /// Under contention, higher is served first (0 to 100).
    pub priority: u32,
    /// What a process that skips the interposer gets.
    pub bypass_action: Action,
    /// What real memory (NVML) above the limit gets.
    pub memory_overage_action: Action,
    /// What a share of the GPU (NVML) above the compute cap gets.
    pub compute_overage_action: Action,
    /// The rule that matched (none: the defaults).
    pub rule: Option<String>,
}

impl Effective {
    /// What the compute controller is asked to hold on each of `meta`'s
    /// GPUs: its SM target, with the mode and priority decided here (its
    /// own explicit values included, see [`Policy::effective`]).
    pub fn control(&self, meta: &Metadata) -> crate::control::ContainerControl {
        crate::control::ContainerControl {
            target_percent: f64::from(meta.sm_target),
            mode: self.mode,
            // At most MAX_PRIORITY (validated): fits.
            priority: i32::try_from(self.priority).unwrap_or(i32::MAX),
        }
    }
}

/// The fields a rule (or the file's `defaults`) may set; `None`: not set
/// there.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Settings {
    /// `computeMode`.
    pub mode: Option<Mode>,
    /// `priority` (0 to [`crate::containers::meta::MAX_PRIORITY`], higher
    /// first).
    pub priority: Option<u32>,
    /// `bypassAction`.
    pub bypass_action: Option<Action>,
    /// `memoryOverageAction`.
    pub memory_overage_action: Option<Action>,
    /// `computeOverageAction`.
    pub compute_overage_action: Option<Action>,
}

impl Settings {
    /// Whether it sets nothing.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// Which containers a rule applies to. At least one criterion is given
/// (checked when the file is parsed); an empty `Match` would match
/// everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Match {
    /// Any of these namespaces; empty: no namespace criterion.
    pub namespaces: Vec<String>,
    /// All of these labels with these values; empty: no label criterion.
    pub pod_labels: BTreeMap<String, String>,
}

impl Match {
    /// Whether a container in `namespace` (none: outside Kubernetes) with
    /// `labels` matches.
    pub fn matches(&self, namespace: Option<&str>, labels: &BTreeMap<String, String>) -> bool {
        let namespace_ok = self.namespaces.is_empty()
            || namespace.is_some_and(|ns| self.namespaces.iter().any(|n| n == ns));
        namespace_ok
            && self
                .pod_labels
                .iter()
                .all(|(k, v)| labels.get(k) == Some(v))
    }
}

/// One rule of the policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    /// Unique within the policy.
    pub name: String,
    /// Which containers it applies to.
    pub matcher: Match,
    /// What it overrides (at least one field).
    pub set: Settings,
}

/// The policy in force.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    /// Applied where neither the metadata nor the matching rule sets a
    /// field (`rule` is always `None` here).
    pub defaults: Effective,
    /// In file order; the first that matches a container wins.
    pub rules: Vec<Rule>,
}

impl Default for Policy {
    /// Without a policy file: the container's own mode and priority (hard
    /// and 0 where it sets none), an alert on a bypass (the memory and
    /// compute watchdogs stay the backstops), a kill on a memory overage
    /// (as the kernel does on a cgroup's memory.max), the throttle on a
    /// compute overage (the container keeps running at its share; killed
    /// only when freezing cannot hold it).
    fn default() -> Self {
        Self {
            defaults: Effective {
                mode: Mode::Hard,
                priority: 0,
                bypass_action: Action::Alert,
                memory_overage_action: Action::Kill,
                compute_overage_action: Action::Throttle,
                rule: None,
            },
            rules: Vec::new(),
        }
    }
}

impl Policy {
    /// The first rule matching a container in `namespace` with `labels`.
    pub fn rule_for(
        &self,
        namespace: Option<&str>,
        labels: &BTreeMap<String, String>,
    ) -> Option<&Rule> {
        self.rules
            .iter()
            .find(|r| r.matcher.matches(namespace, labels))
    }

    /// What applies to the container described by `meta` (see the module
    /// documentation for the order).
    pub fn effective(&self, meta: &Metadata) -> Effective {
        let rule = self.rule_for(meta.namespace.as_deref(), &meta.labels);
        let set = rule.map(|r| &r.set);
        let d = &self.defaults;
        Effective {
            mode: meta.mode.or(set.and_then(|s| s.mode)).unwrap_or(d.mode),
            priority: meta
                .priority
                .or(set.and_then(|s| s.priority))
                .unwrap_or(d.priority),
            bypass_action: set.and_then(|s| s.bypass_action).unwrap_or(d.bypass_action),
            memory_overage_action: set
                .and_then(|s| s.memory_overage_action)
                .unwrap_or(d.memory_overage_action),
            compute_overage_action: set
                .and_then(|s| s.compute_overage_action)
                .unwrap_or(d.compute_overage_action),
            rule: rule.map(|r| r.name.clone()),
        }
    }
}

#[cfg(test)]
mod tests;
