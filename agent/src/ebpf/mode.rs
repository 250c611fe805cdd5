//! Choosing how the ioctl observer attaches.
//!
//! Preference (cheapest for the rest of the node first, `reference/ebpf.md`
//! §3 and §7): a kprobe on the NVIDIA drivers' ioctl entry points costs
//! nothing outside NVIDIA ioctls; both syscall hooks put every task on the
//! syscall slow path. Of those, the syscall tracepoint runs no program on
//! other syscalls, while `raw_tp/sys_enter` runs one on every syscall. The
//! observer tries the candidates in order and falls back on failure.

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use tessera_ebpf_common::names;

/// The NVIDIA frontend's ioctl handler.
pub const NVIDIA_IOCTL_FN: &str = "nvidia_unlocked_ioctl";
/// The UVM driver's ioctl handler.
pub const UVM_IOCTL_FN: &str = "uvm_unlocked_ioctl_entry";
const KPROBE_PMU: &str = "/sys/bus/event_source/devices/kprobe";
const KALLSYMS: &str = "/proc/kallsyms";

/// How the ioctl program is attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttachMode {
    /// kprobe on `nvidia_unlocked_ioctl` (and `uvm_unlocked_ioctl_entry`).
    Kprobe,
    /// Tracepoint `syscalls/sys_enter_ioctl`.
    Tracepoint,
    /// Raw tracepoint `sys_enter`.
    RawTracepoint,
}

impl AttachMode {
    /// Every mode, in the order `auto` tries them.
    pub const AUTO_ORDER: [Self; 3] = [Self::Kprobe, Self::Tracepoint, Self::RawTracepoint];

    /// The ioctl program this mode attaches where the kernel has
    /// `bpf_rdonly_cast` (see [`super::kfunc`]).
    pub fn program(self) -> &'static str {
        match self {
            Self::Kprobe => names::PROG_IOCTL_KPROBE,
            Self::Tracepoint => names::PROG_IOCTL_TRACEPOINT,
            Self::RawTracepoint => names::PROG_IOCTL_RAW_TRACEPOINT,
        }
    }

    /// The same program reading kernel structs with
    /// `bpf_probe_read_kernel`, for kernels without that kfunc.
    pub fn probe_program(self) -> &'static str {
        match self {
            Self::Kprobe => names::PROG_IOCTL_KPROBE_PROBE,
            Self::Tracepoint => names::PROG_IOCTL_TRACEPOINT_PROBE,
            Self::RawTracepoint => names::PROG_IOCTL_RAW_TRACEPOINT_PROBE,
        }
    }

    /// The configuration name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Kprobe => "kprobe",
            Self::Tracepoint => "tracepoint",
            Self::RawTracepoint => "raw-tracepoint",
        }
    }
}

impl fmt::Display for AttachMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The configured choice.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ModeRequest {
    /// The best mode the kernel supports.
    #[default]
    Auto,
    /// Exactly this mode, or fail.
    Only(AttachMode),
}

impl ModeRequest {
    /// Whether `mode` is among the modes this request may try.
    pub fn may_try(self, mode: AttachMode) -> bool {
        match self {
            Self::Auto => true,
            Self::Only(only) => only == mode,
        }
    }
}

/// An unknown mode name.
#[derive(Debug, thiserror::Error)]
#[error("unknown ebpf attach mode {0:?}: expected auto, kprobe, tracepoint or raw-tracepoint")]
pub struct ModeParseError(String);

impl FromStr for ModeRequest {
    type Err = ModeParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "auto" {
            return Ok(Self::Auto);
        }
        AttachMode::AUTO_ORDER
            .into_iter()
            .find(|m| m.name() == s)
            .map(Self::Only)
            .ok_or_else(|| ModeParseError(s.to_owned()))
    }
}

/// What the kernel offers, as far as the choice of mode goes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KernelFacts {
    /// The kprobe PMU exists (`CONFIG_KPROBES` with perf).
    pub kprobes: bool,
    /// `nvidia_unlocked_ioctl` is in kallsyms (nvidia.ko loaded).
    pub nvidia_ioctl: bool,
    /// `uvm_unlocked_ioctl_entry` is in kallsyms (nvidia-uvm.ko loaded).
    pub uvm_ioctl: bool,
}

impl KernelFacts {
    /// Reads the facts of the running kernel.
    pub fn probe() -> Self {
        let kallsyms = std::fs::read_to_string(KALLSYMS).unwrap_or_default();
        Self::from_parts(Path::new(KPROBE_PMU).exists(), &kallsyms)
    }

    /// The facts `request` needs: [`KernelFacts::probe`] where a kprobe may
    /// be tried, else none (the kprobe facts matter to nothing else, and
    /// `/proc/kallsyms` is large).
    pub fn probe_for(request: ModeRequest) -> Self {
        if request.may_try(AttachMode::Kprobe) {
            Self::probe()
        } else {
            Self::default()
        }
    }

    /// Facts from a kprobe-PMU flag and `/proc/kallsyms` text.
    pub fn from_parts(kprobes: bool, kallsyms: &str) -> Self {
        let mut facts = Self {
            kprobes,
            ..Self::default()
        };
        for name in kallsyms.lines().filter_map(|l| l.split_whitespace().nth(2)) {
            facts.nvidia_ioctl |= name == NVIDIA_IOCTL_FN;
            facts.uvm_ioctl |= name == UVM_IOCTL_FN;
        }
        facts
    }

    /// Why `mode` cannot work here, if it cannot.
    pub fn unavailable(&self, mode: AttachMode) -> Option<String> {
        match mode {
            AttachMode::Kprobe if !self.kprobes => {
                Some(format!("no kprobe support ({KPROBE_PMU} is missing)"))
            }
            AttachMode::Kprobe if !self.nvidia_ioctl => Some(format!(
                "{NVIDIA_IOCTL_FN} is not in {KALLSYMS} (nvidia.ko not loaded)"
            )),
            _ => None,
        }
    }
}

/// The modes to try, in order, and those left out with the reason.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Try these in order.
    pub candidates: Vec<AttachMode>,
    /// Left out, with why.
    pub skipped: Vec<(AttachMode, String)>,
}

/// Plans the attach for `request` on a kernel with `facts`. An explicit
/// mode is always tried, so its failure names the kernel's reason.
pub fn plan(request: ModeRequest, facts: &KernelFacts) -> Plan {
    let mut plan = Plan::default();
    match request {
        ModeRequest::Only(mode) => plan.candidates.push(mode),
        ModeRequest::Auto => {
            for mode in AttachMode::AUTO_ORDER {
                match facts.unavailable(mode) {
                    Some(why) => plan.skipped.push((mode, why)),
                    None => plan.candidates.push(mode),
                }
            }
        }
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    const KALLSYMS_NV: &str = "\
ffffffffc0a00000 t nvidia_unlocked_ioctl\t[nvidia]
ffffffffc0b00000 t uvm_unlocked_ioctl_entry\t[nvidia_uvm]
ffffffff81000000 T _stext
";

    #[test]
    fn auto_prefers_kprobe_on_nvidia_nodes() {
        let facts = KernelFacts::from_parts(true, KALLSYMS_NV);
        assert!(facts.nvidia_ioctl && facts.uvm_ioctl);
        let p = plan(ModeRequest::Auto, &facts);
        assert_eq!(
            p.candidates,
            [
                AttachMode::Kprobe,
                AttachMode::Tracepoint,
                AttachMode::RawTracepoint
            ]
        );
        assert!(p.skipped.is_empty());
    }

    #[test]
    fn auto_falls_back_without_kprobes_or_driver() {
        let no_driver = KernelFacts::from_parts(true, "ffffffff81000000 T _stext\n");
        let p = plan(ModeRequest::Auto, &no_driver);
        assert_eq!(
            p.candidates,
            [AttachMode::Tracepoint, AttachMode::RawTracepoint]
        );
        assert_eq!(p.skipped.len(), 1);
        assert!(
            p.skipped[0].1.contains("nvidia.ko not loaded"),
            "{:?}",
            p.skipped
        );

        let no_kprobes = KernelFacts::from_parts(false, KALLSYMS_NV);
        let p = plan(ModeRequest::Auto, &no_kprobes);
        assert_eq!(p.skipped[0].0, AttachMode::Kprobe);
        assert!(
            p.skipped[0].1.starts_with("no kprobe support"),
            "{:?}",
            p.skipped
        );
    }

    #[test]
    fn explicit_mode_is_tried_even_if_it_looks_unavailable() {
        let p = plan(
            ModeRequest::Only(AttachMode::Kprobe),
            &KernelFacts::default(),
        );
        assert_eq!(p.candidates, [AttachMode::Kprobe]);
    }

    #[test]
    fn kernel_facts_are_read_only_where_a_kprobe_may_be_tried() {
        assert!(ModeRequest::Auto.may_try(AttachMode::Kprobe));
        assert!(ModeRequest::Only(AttachMode::Kprobe).may_try(AttachMode::Kprobe));
        let tp = ModeRequest::Only(AttachMode::Tracepoint);
        assert!(!tp.may_try(AttachMode::Kprobe));
        assert_eq!(KernelFacts::probe_for(tp), KernelFacts::default());
    }

    #[test]
    fn parses_mode_names() {
        assert_eq!("auto".parse::<ModeRequest>().unwrap(), ModeRequest::Auto);
        for mode in AttachMode::AUTO_ORDER {
            assert_eq!(
                mode.name().parse::<ModeRequest>().unwrap(),
                ModeRequest::Only(mode)
            );
        }
        let err = "fentry".parse::<ModeRequest>().unwrap_err();
        assert!(
            err.to_string()
                .starts_with("unknown ebpf attach mode \"fentry\"")
        );
    }
}
