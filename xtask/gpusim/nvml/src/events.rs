//! Event sets: which GPUs' Xids a caller waits for, and the waiting.
//!
//! Only `nvmlEventTypeXidCriticalError` is simulated: the Xids injected
//! with `gpusim xid` (and Xid 79 when a GPU is marked lost) live in the
//! node's shared state, each with a sequence number. Registering a GPU
//! remembers its newest sequence number, so earlier Xids are not
//! delivered (as the API says); waiting polls the shared state every
//! [`POLL_INTERVAL`] for newer ones until the timeout.
//!
//! An event set handle is the address of a byte the registry owns; looking
//! a handle up is a map lookup by that value, so a handle that is not ours
//! is rejected without being dereferenced.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use gpusim::layout::XidRecord;

use crate::abi::{EVENT_XID_CRITICAL_ERROR, EventSetHandle};
use crate::error::NvmlError;
use crate::library::Context;

/// How often a waiting caller looks for new Xids.
pub const POLL_INTERVAL: Duration = Duration::from_millis(5);

/// Event types a device can deliver.
pub const SUPPORTED: u64 = EVENT_XID_CRITICAL_ERROR;

/// One GPU's registration in a set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Registration {
    gpu: usize,
    types: u64,
    /// Sequence number of the last Xid seen (delivered or predating the
    /// registration).
    cursor: u64,
}

/// One event set.
#[derive(Debug, Default)]
pub struct EventSet {
    registrations: Vec<Registration>,
}

/// An event taken from a set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event {
    /// GPU index.
    pub gpu: usize,
    /// `nvmlEventType*` bit.
    pub event_type: u64,
    /// The Xid.
    pub xid: u64,
}

impl EventSet {
    /// Adds `types` of `gpu` to the set; Xids up to now are skipped.
    pub fn register(&mut self, ctx: &Context, gpu: usize, types: u64) -> Result<(), NvmlError> {
        let cursor = ctx.sim.xid_cursor(gpu)?;
        match self.registrations.iter_mut().find(|r| r.gpu == gpu) {
            Some(r) => r.types |= types,
            None => self.registrations.push(Registration { gpu, types, cursor }),
        }
        Ok(())
    }

    /// Takes the oldest pending event, if any. With none pending and a
    /// registered GPU lost, fails with `NVML_ERROR_GPU_IS_LOST`.
    fn take(&mut self, ctx: &Context) -> Result<Option<Event>, NvmlError> {
        // Looked at before the Xids: the simulator records a lost GPU's
        // Xid 79 before it sets the flag, so that Xid is among those read
        // below and is delivered before the loss is reported.
        let mut lost = false;
        for r in &self.registrations {
            lost |= ctx.sim.is_lost(r.gpu)?;
        }
        let mut oldest: Option<(usize, XidRecord)> = None;
        for (i, r) in self.registrations.iter().enumerate() {
            if r.types & EVENT_XID_CRITICAL_ERROR == 0 {
                continue;
            }
            let next = ctx.sim.xids_after(r.gpu, r.cursor)?.into_iter().next();
            if let Some(x) = next
                && oldest.is_none_or(|(_, o)| x.unix_ns < o.unix_ns)
            {
                oldest = Some((i, x));
            }
        }
        if let Some((i, x)) = oldest {
            let r = &mut self.registrations[i];
            r.cursor = x.seq;
            return Ok(Some(Event {
                gpu: r.gpu,
                event_type: EVENT_XID_CRITICAL_ERROR,
                xid: x.xid,
            }));
        }
        if lost {
            return Err(NvmlError::GpuIsLost);
        }
        Ok(None)
    }

    /// Waits up to `timeout` for an event (`NVML_ERROR_TIMEOUT` if none).
    pub fn wait(&mut self, ctx: &Context, timeout: Duration) -> Result<Event, NvmlError> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(e) = self.take(ctx)? {
                return Ok(e);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(NvmlError::Timeout);
            }
            std::thread::sleep(POLL_INTERVAL.min(deadline - now));
        }
    }
}

/// A registry entry: the byte whose address is the handle, and the set.
struct Entry {
    _anchor: Box<u8>,
    set: Arc<Mutex<EventSet>>,
}

static REGISTRY: Mutex<Option<HashMap<usize, Entry>>> = Mutex::new(None);

fn registry() -> MutexGuard<'static, Option<HashMap<usize, Entry>>> {
    REGISTRY.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Creates a set and returns its handle.
pub fn create() -> EventSetHandle {
    let anchor = Box::new(0u8);
    let handle = (&raw const *anchor).cast_mut().cast();
    let entry = Entry {
        _anchor: anchor,
        set: Arc::default(),
    };
    registry()
        .get_or_insert_with(HashMap::new)
        .insert(handle as usize, entry);
    handle
}

/// The set behind `handle`, if it is one of ours.
pub fn lookup(handle: EventSetHandle) -> Result<Arc<Mutex<EventSet>>, NvmlError> {
    registry()
        .as_ref()
        .and_then(|m| m.get(&(handle as usize)))
        .map(|e| Arc::clone(&e.set))
        .ok_or(NvmlError::InvalidArgument)
}

/// Frees the set behind `handle`.
pub fn free(handle: EventSetHandle) -> Result<(), NvmlError> {
    registry()
        .as_mut()
        .and_then(|m| m.remove(&(handle as usize)))
        .map(drop)
        .ok_or(NvmlError::InvalidArgument)
}

/// Frees every set (the library was shut down).
pub fn clear() {
    *registry() = None;
}

/// Locks a set, recovering from a panic in another caller.
pub fn lock(set: &Mutex<EventSet>) -> MutexGuard<'_, EventSet> {
    set.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_are_looked_up_not_dereferenced() {
        let h = create();
        assert!(lookup(h).is_ok());
        let mut foreign = 0u8;
        assert_eq!(
            lookup((&raw mut foreign).cast()).err(),
            Some(NvmlError::InvalidArgument)
        );
        free(h).unwrap();
        assert_eq!(free(h), Err(NvmlError::InvalidArgument));
        assert!(lookup(h).is_err());
    }
}
