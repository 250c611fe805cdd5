//! The node policy (design §4.5): defaults plus rules matched by namespace
//! and pod labels, deciding each container's compute mode, priority and
//! what the watchdog does on a bypass or a memory overage.
//!
//! This file fixes the shape the daemon and the watchdog use
//! ([`Action`], [`Effective`], [`Policy::effective`]); the YAML loader and
//! hot reload build on it.

use serde::{Deserialize, Serialize};

use crate::containers::Metadata;
use crate::control::Mode;

/// What the watchdog does to a container that broke a limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// Log and count it; nothing else.
    Alert,
    /// Deny the container's further opens of GPU devices (the cgroup
    /// device guard); handles it holds keep working.
    Deny,
    /// Freeze the container's cgroup (`cgroup.freeze`).
    Freeze,
    /// Kill every process of the container's cgroup (`cgroup.kill`).
    Kill,
}

impl Action {
    /// Every action, mildest first.
    pub const ALL: [Action; 4] = [Action::Alert, Action::Deny, Action::Freeze, Action::Kill];

    /// The name used in policy files, logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Alert => "alert",
            Action::Deny => "deny",
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
    /// The rule that matched (none: the defaults).
    pub rule: Option<String>,
}

/// The policy in force.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    /// Applied where no rule sets a field.
    pub defaults: Effective,
}

impl Default for Policy {
    /// Without a policy file: the container's own mode and priority, an
    /// alert on a bypass (the memory watchdog stays the backstop), a kill
    /// on a memory overage (as the kernel does on a cgroup's memory.max).
    fn default() -> Self {
        Self {
            defaults: Effective {
                mode: Mode::Hard,
                priority: 0,
                bypass_action: Action::Alert,
                memory_overage_action: Action::Kill,
                rule: None,
            },
        }
    }
}

impl Policy {
    /// What applies to the container described by `meta`.
    pub fn effective(&self, meta: &Metadata) -> Effective {
        Effective {
            mode: meta.mode,
            priority: meta.priority,
            ..self.defaults.clone()
        }
    }
}
