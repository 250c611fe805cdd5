//! Preload registration and bypass events.
//!
//! The preload registers each process in its container's usage region;
//! the agent copies those tgids into the kernel's `REGISTERED` map
//! ([`Observer::register_tgid`]) and names the GPU pods' cgroups
//! ([`Observer::watch_cgroup`]). The first NVIDIA device open or ioctl by
//! an unregistered process inside a watched cgroup (or its subtree) becomes
//! one [`Bypass`] on the `EVENTS` ring buffer, read through
//! [`BypassEvents`]. The kernel forgets a process's registration and its
//! "reported" mark when it exits (if the exit hook is attached), so the
//! agent need not prune them; it must, though, copy only live processes
//! from the usage regions (a slot of a dead process registered again would
//! cover whoever reuses its pid). Cgroups outside every watched one
//! (system daemons) are never reported.

use std::os::fd::{AsFd, BorrowedFd};
use std::time::Duration;

use aya::maps::{HashMap, MapData, RingBuf};
use rustix::event::{PollFd, PollFlags, Timespec, poll};
use tessera_ebpf_common::{
    dev::{kdev_major, kdev_minor},
    events::{BypassEvent, kind},
    names,
};

use super::observer::{Observer, ObserverError, entries};

/// Errors waiting for events.
#[derive(Debug, thiserror::Error)]
pub enum EventsError {
    /// poll(2) on the ring buffer failed.
    #[error("cannot poll the ebpf bypass event ring buffer")]
    Poll(#[source] std::io::Error),
}

/// What a bypassing process did first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// An ioctl: the decoded number and `ioctl::flags`.
    Ioctl {
        /// `_IOC_NR` (frontend, XFER unwrapped) or the raw UVM command.
        nr: u32,
        /// `tessera_ebpf_common::ioctl::flags`.
        flags: u32,
    },
    /// An open (device access check): `keys::access` bits.
    Open {
        /// Read, write, mknod bits.
        access: u32,
    },
}

/// The first NVIDIA device access of a process that has not registered
/// with the preload, inside a watched cgroup.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bypass {
    /// Thread id.
    pub pid: u32,
    /// Process id.
    pub tgid: u32,
    /// The process's cgroup v2 id.
    pub cgroup_id: u64,
    /// The watched cgroup it is in (its pod).
    pub watched_cgroup_id: u64,
    /// Device major.
    pub major: u32,
    /// Device minor.
    pub minor: u32,
    /// What it did.
    pub access: Access,
    /// Thread name.
    pub comm: String,
    /// CLOCK_MONOTONIC time of the access, ns.
    pub ktime_ns: u64,
}

impl Bypass {
    /// The typed form of a ring-buffer record; `None` for an unknown kind.
    pub fn from_event(e: &BypassEvent) -> Option<Self> {
        let access = match e.kind {
            kind::IOCTL => Access::Ioctl {
                nr: e.nr,
                flags: e.flags,
            },
            kind::OPEN => Access::Open { access: e.nr },
            _ => return None,
        };
        Some(Self {
            pid: e.pid,
            tgid: e.tgid,
            cgroup_id: e.cgroup_id,
            watched_cgroup_id: e.watched_cgroup_id,
            major: kdev_major(e.dev),
            minor: kdev_minor(e.dev),
            access,
            comm: String::from_utf8_lossy(e.comm()).into_owned(),
            ktime_ns: e.ktime_ns,
        })
    }
}

/// Reader of the bypass ring buffer. Poll its fd for readability (or call
/// [`BypassEvents::wait`]), then drain with [`BypassEvents::next`].
pub struct BypassEvents {
    ring: RingBuf<MapData>,
    malformed: u64,
}

impl std::fmt::Debug for BypassEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BypassEvents")
            .field("malformed", &self.malformed)
            .finish_non_exhaustive()
    }
}

impl BypassEvents {
    /// The next event, if one is waiting. Malformed records are skipped
    /// and counted ([`BypassEvents::malformed`]).
    #[allow(
        clippy::should_implement_trait,
        reason = "not an Iterator: a drained buffer fills again later"
    )]
    pub fn next(&mut self) -> Option<Bypass> {
        loop {
            let item = self.ring.next()?;
            let typed = BypassEvent::from_bytes(&item).and_then(|e| Bypass::from_event(&e));
            drop(item);
            match typed {
                Some(event) => return Some(event),
                None => self.malformed += 1,
            }
        }
    }

    /// Every event waiting now.
    pub fn drain(&mut self) -> Vec<Bypass> {
        std::iter::from_fn(|| self.next()).collect()
    }

    /// Waits up to `timeout` for the buffer to become readable; returns
    /// whether it is.
    pub fn wait(&mut self, timeout: Duration) -> Result<bool, EventsError> {
        let timeout = Timespec {
            tv_sec: i64::try_from(timeout.as_secs()).unwrap_or(i64::MAX),
            tv_nsec: i64::from(timeout.subsec_nanos()),
        };
        let mut fds = [PollFd::new(&self.ring, PollFlags::IN)];
        match poll(&mut fds, Some(&timeout)) {
            Ok(n) => Ok(n > 0),
            Err(rustix::io::Errno::INTR) => Ok(false),
            Err(e) => Err(EventsError::Poll(e.into())),
        }
    }

    /// Records that could not be decoded.
    pub fn malformed(&self) -> u64 {
        self.malformed
    }
}

impl AsFd for BypassEvents {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.ring.as_fd()
    }
}

impl Observer {
    /// Marks process `tgid` as registered with the preload.
    pub fn register_tgid(&mut self, tgid: u32) -> Result<(), ObserverError> {
        self.set::<u32>(names::REGISTERED)?
            .insert(tgid, 0, 0)
            .map_err(ObserverError::map(names::REGISTERED))
    }

    /// Forgets process `tgid`'s registration (absent is fine).
    pub fn unregister_tgid(&mut self, tgid: u32) -> Result<(), ObserverError> {
        remove_absent_ok(
            names::REGISTERED,
            self.set::<u32>(names::REGISTERED)?.remove(&tgid),
        )?;
        // After the removal: the programs' cached "needs no report" of
        // registered processes is void.
        self.task_epoch.advance(&mut self.ebpf)
    }

    /// The processes registered now (exited ones are removed by the
    /// kernel).
    pub fn registered_tgids(&self) -> Result<Vec<u32>, ObserverError> {
        Ok(entries::<u32, u32>(&self.ebpf, names::REGISTERED)?
            .into_keys()
            .collect())
    }

    /// Requires registration from the processes of cgroup `cgroup_id` and
    /// its subtree (a GPU pod's cgroup).
    pub fn watch_cgroup(&mut self, cgroup_id: u64) -> Result<(), ObserverError> {
        self.set::<u64>(names::WATCHED_CGROUPS)?
            .insert(cgroup_id, 0, 0)
            .map_err(ObserverError::map(names::WATCHED_CGROUPS))?;
        // After the change: the programs' cached cgroup verdicts are void.
        self.cgroup_epoch.advance(&mut self.ebpf)
    }

    /// Stops watching cgroup `cgroup_id` (absent is fine).
    pub fn unwatch_cgroup(&mut self, cgroup_id: u64) -> Result<(), ObserverError> {
        remove_absent_ok(
            names::WATCHED_CGROUPS,
            self.set::<u64>(names::WATCHED_CGROUPS)?.remove(&cgroup_id),
        )?;
        self.cgroup_epoch.advance(&mut self.ebpf)
    }

    /// The watched cgroups.
    pub fn watched_cgroups(&self) -> Result<Vec<u64>, ObserverError> {
        Ok(entries::<u64, u32>(&self.ebpf, names::WATCHED_CGROUPS)?
            .into_keys()
            .collect())
    }

    /// Processes reported as bypassing and not yet exited.
    pub fn reported_tgids(&self) -> Result<Vec<u32>, ObserverError> {
        Ok(entries::<u32, u64>(&self.ebpf, names::REPORTED)?
            .into_keys()
            .collect())
    }

    /// Takes the bypass event reader; there is one per observer, so a
    /// second call fails with [`ObserverError::Missing`].
    pub fn bypass_events(&mut self) -> Result<BypassEvents, ObserverError> {
        let name = names::EVENTS;
        let map = self
            .ebpf
            .take_map(name)
            .ok_or(ObserverError::Missing(name))?;
        let ring = RingBuf::try_from(map).map_err(ObserverError::map(name))?;
        Ok(BypassEvents { ring, malformed: 0 })
    }

    /// Hash map `name` used as a set: keys `K`, values 0.
    fn set<K: aya::Pod>(
        &mut self,
        name: &'static str,
    ) -> Result<HashMap<&mut MapData, K, u32>, ObserverError> {
        let map = self
            .ebpf
            .map_mut(name)
            .ok_or(ObserverError::Missing(name))?;
        HashMap::try_from(map).map_err(ObserverError::map(name))
    }
}

fn remove_absent_ok(
    map: &'static str,
    result: Result<(), aya::maps::MapError>,
) -> Result<(), ObserverError> {
    match result {
        Ok(()) | Err(aya::maps::MapError::KeyNotFound) => Ok(()),
        Err(source) => Err(ObserverError::map(map)(source)),
    }
}

#[cfg(test)]
mod tests {
    use tessera_ebpf_common::dev::kdev;

    use super::*;

    #[test]
    fn types_ring_records() {
        let mut comm = [0u8; 16];
        comm[..6].copy_from_slice(b"python");
        let raw = BypassEvent {
            ktime_ns: 5,
            cgroup_id: 70,
            watched_cgroup_id: 60,
            pid: 11,
            tgid: 10,
            dev: kdev(195, 255),
            kind: kind::IOCTL,
            nr: 0x2B,
            flags: 0,
            comm,
        };
        let b = Bypass::from_event(&raw).unwrap();
        assert_eq!((b.major, b.minor), (195, 255));
        assert_eq!(b.access, Access::Ioctl { nr: 0x2B, flags: 0 });
        assert_eq!(b.comm, "python");
        assert_eq!(
            (b.pid, b.tgid, b.cgroup_id, b.watched_cgroup_id),
            (11, 10, 70, 60)
        );
        let open = BypassEvent {
            kind: kind::OPEN,
            nr: 6,
            ..raw
        };
        assert_eq!(
            Bypass::from_event(&open).unwrap().access,
            Access::Open { access: 6 }
        );
        let bad = BypassEvent { kind: 99, ..raw };
        assert_eq!(Bypass::from_event(&bad), None);
    }
}
