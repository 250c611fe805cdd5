//! The per-pod device guard's policy and decision.
//!
//! One guard program instance is loaded per pod, with its policy in the
//! `TESSERA_GUARD` global, and attached to the pod's cgroup. It denies
//! opening (and mknod of) the *guarded* devices, GPU minors, except those
//! *allowed* for the pod; devices matching an *always* range (the control
//! node, modeset, the UVM major) pass first, and anything not guarded
//! passes. The decision is [`GuardPolicy::allows`], shared with the host
//! tests.

use crate::dev::kdev;

/// Ranges of each kind a policy holds.
pub const MAX_RANGES: usize = 4;
/// Devices a pod can be allowed.
pub const MAX_ALLOWED: usize = 32;
/// `BPF_DEVCG_DEV_CHAR`.
pub const DEV_CHAR: u32 = 2;

/// Minors `first..=last` of one major.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DevRange {
    /// Major number.
    pub major: u32,
    /// First minor.
    pub first_minor: u32,
    /// Last minor (inclusive).
    pub last_minor: u32,
}

impl DevRange {
    /// One device.
    pub const fn one(major: u32, minor: u32) -> Self {
        Self {
            major,
            first_minor: minor,
            last_minor: minor,
        }
    }

    /// Every minor of `major`.
    pub const fn major(major: u32) -> Self {
        Self {
            major,
            first_minor: 0,
            last_minor: u32::MAX,
        }
    }

    /// Whether `major:minor` is in the range.
    #[inline(always)]
    pub const fn contains(&self, major: u32, minor: u32) -> bool {
        major == self.major && minor >= self.first_minor && minor <= self.last_minor
    }
}

/// The `TESSERA_GUARD` global.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GuardPolicy {
    /// Used entries of `always`.
    pub n_always: u32,
    /// Used entries of `guarded`.
    pub n_guarded: u32,
    /// Used entries of `allowed`.
    pub n_allowed: u32,
    /// Zero.
    pub reserved: u32,
    /// Always allowed (control, modeset, UVM), checked first.
    pub always: [DevRange; MAX_RANGES],
    /// Denied unless allowed (GPU minors, MIG capabilities).
    pub guarded: [DevRange; MAX_RANGES],
    /// Kernel `dev_t`s of the guarded devices assigned to the pod.
    pub allowed: [u32; MAX_ALLOWED],
}

impl GuardPolicy {
    /// The value compiled into the object: guards nothing.
    pub const UNSET: Self = Self {
        n_always: 0,
        n_guarded: 0,
        n_allowed: 0,
        reserved: 0,
        always: [DevRange {
            major: 0,
            first_minor: 0,
            last_minor: 0,
        }; MAX_RANGES],
        guarded: [DevRange {
            major: 0,
            first_minor: 0,
            last_minor: 0,
        }; MAX_RANGES],
        allowed: [0; MAX_ALLOWED],
    };

    /// Whether an access of `access_type` (`(ACC << 16) | TYPE`) to
    /// `major:minor` is allowed.
    #[inline(always)]
    pub fn allows(&self, access_type: u32, major: u32, minor: u32) -> bool {
        if access_type & 0xFFFF != DEV_CHAR {
            return true;
        }
        let mut i = 0;
        while i < MAX_RANGES {
            if (i as u32) < self.n_always && self.always[i].contains(major, minor) {
                return true;
            }
            i += 1;
        }
        let mut guarded = false;
        let mut i = 0;
        while i < MAX_RANGES {
            if (i as u32) < self.n_guarded && self.guarded[i].contains(major, minor) {
                guarded = true;
            }
            i += 1;
        }
        if !guarded {
            return true;
        }
        let dev = kdev(major, minor);
        let mut i = 0;
        while i < MAX_ALLOWED {
            if (i as u32) < self.n_allowed && self.allowed[i] == dev {
                return true;
            }
            i += 1;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const READ_CHAR: u32 = (2 << 16) | DEV_CHAR;
    const MKNOD_CHAR: u32 = (1 << 16) | DEV_CHAR;
    const READ_BLOCK: u32 = (2 << 16) | 1;

    fn nvidia(allowed: &[(u32, u32)]) -> GuardPolicy {
        let mut p = GuardPolicy::UNSET;
        p.always[0] = DevRange {
            major: 195,
            first_minor: 254,
            last_minor: 255,
        };
        p.always[1] = DevRange::major(510);
        p.n_always = 2;
        p.guarded[0] = DevRange {
            major: 195,
            first_minor: 0,
            last_minor: 247,
        };
        p.guarded[1] = DevRange::major(511);
        p.n_guarded = 2;
        for (i, (ma, mi)) in allowed.iter().enumerate() {
            p.allowed[i] = kdev(*ma, *mi);
        }
        p.n_allowed = allowed.len() as u32;
        p
    }

    #[test]
    fn denies_unassigned_gpus_only() {
        let p = nvidia(&[(195, 1), (511, 3)]);
        assert!(p.allows(READ_CHAR, 195, 1));
        assert!(!p.allows(READ_CHAR, 195, 0));
        assert!(!p.allows(READ_CHAR, 195, 247));
        assert!(!p.allows(MKNOD_CHAR, 195, 2));
        assert!(p.allows(READ_CHAR, 195, 255), "nvidiactl");
        assert!(p.allows(READ_CHAR, 195, 254), "modeset");
        assert!(p.allows(READ_CHAR, 510, 0), "uvm");
        assert!(p.allows(READ_CHAR, 510, 1), "uvm-tools");
        assert!(p.allows(READ_CHAR, 511, 3), "assigned MIG capability");
        assert!(!p.allows(READ_CHAR, 511, 4));
        assert!(p.allows(READ_CHAR, 1, 3), "not a GPU device");
        assert!(
            p.allows(READ_BLOCK, 195, 0),
            "block devices are not guarded"
        );
    }

    #[test]
    fn unused_entries_are_ignored() {
        // A stale entry beyond n_allowed must not allow anything.
        let mut p = nvidia(&[]);
        p.allowed[0] = kdev(195, 0);
        assert!(!p.allows(READ_CHAR, 195, 0));
        assert!(GuardPolicy::UNSET.allows(READ_CHAR, 195, 0));
    }

    #[test]
    fn always_wins_over_guarded() {
        let mut p = nvidia(&[]);
        p.always[2] = DevRange::one(195, 7);
        p.n_always = 3;
        assert!(p.allows(READ_CHAR, 195, 7));
    }

    #[test]
    fn no_implicit_padding() {
        assert_eq!(core::mem::size_of::<DevRange>(), 12);
        assert_eq!(core::mem::size_of::<GuardPolicy>(), 16 + 48 + 48 + 128);
    }
}
