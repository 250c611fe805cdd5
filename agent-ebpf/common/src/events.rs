//! Records the programs put on the `EVENTS` ring buffer.

/// What a [`BypassEvent`] saw.
pub mod kind {
    /// An ioctl on a watched device; `nr`/`flags` as in `keys::IoctlKey`.
    pub const IOCTL: u32 = 1;
    /// An open (device access check); `nr` holds the `keys::access` bits.
    pub const OPEN: u32 = 2;
}

/// The first NVIDIA device access (open or ioctl) by a process that has
/// not registered with the preload, from inside a watched (GPU pod)
/// cgroup. The programs send at most one per process.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BypassEvent {
    /// `bpf_ktime_get_ns` (CLOCK_MONOTONIC) of the access.
    pub ktime_ns: u64,
    /// Cgroup v2 id of the process.
    pub cgroup_id: u64,
    /// The watched cgroup it is in (itself or an ancestor), e.g. its pod.
    pub watched_cgroup_id: u64,
    /// Thread id.
    pub pid: u32,
    /// Process (thread group) id.
    pub tgid: u32,
    /// Kernel `dev_t` of the device (see `dev::kdev`).
    pub dev: u32,
    /// One of [`kind`].
    pub kind: u32,
    /// The ioctl number (decoded) or the access bits of an open.
    pub nr: u32,
    /// `ioctl::flags` of an ioctl, 0 for an open.
    pub flags: u32,
    /// The thread's name, NUL padded.
    pub comm: [u8; 16],
}

/// Size of a [`BypassEvent`] record.
pub const BYPASS_EVENT_SIZE: usize = core::mem::size_of::<BypassEvent>();

impl BypassEvent {
    /// Decodes a record (native byte order); `None` if it is too short.
    pub fn from_bytes(b: &[u8]) -> Option<Self> {
        if b.len() < BYPASS_EVENT_SIZE {
            return None;
        }
        // SAFETY: `b` holds at least `size_of::<Self>()` bytes, read
        // without assuming alignment; `Self` is `#[repr(C)]` of integers
        // with no padding, so any bytes are a valid value.
        Some(unsafe { b.as_ptr().cast::<Self>().read_unaligned() })
    }

    /// The thread name up to its first NUL.
    pub fn comm(&self) -> &[u8] {
        let end = self.comm.iter().position(|&c| c == 0).unwrap_or(16);
        &self.comm[..end]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_its_own_bytes() {
        let mut comm = [0u8; 16];
        comm[..5].copy_from_slice(b"bench");
        let e = BypassEvent {
            ktime_ns: 1,
            cgroup_id: 2,
            watched_cgroup_id: 3,
            pid: 4,
            tgid: 5,
            dev: 6,
            kind: kind::OPEN,
            nr: 8,
            flags: 9,
            comm,
        };
        assert_eq!(BYPASS_EVENT_SIZE, 64);
        let mut bytes = [0u8; 64];
        let fields: [&[u8]; 10] = [
            &e.ktime_ns.to_ne_bytes(),
            &e.cgroup_id.to_ne_bytes(),
            &e.watched_cgroup_id.to_ne_bytes(),
            &e.pid.to_ne_bytes(),
            &e.tgid.to_ne_bytes(),
            &e.dev.to_ne_bytes(),
            &e.kind.to_ne_bytes(),
            &e.nr.to_ne_bytes(),
            &e.flags.to_ne_bytes(),
            &e.comm,
        ];
        let mut at = 0;
        for f in fields {
            bytes[at..at + f.len()].copy_from_slice(f);
            at += f.len();
        }
        assert_eq!(BypassEvent::from_bytes(&bytes), Some(e));
        assert_eq!(BypassEvent::from_bytes(&bytes).unwrap().comm(), b"bench");
        assert_eq!(BypassEvent::from_bytes(&bytes[..63]), None);
    }
}
