//! GPU health for `ListAndWatch`, from NVML.
//!
//! A thread waits on an NVML event set for critical Xid events on every
//! GPU (in slices of [`WAIT`]) and probes each GPU between waits. A GPU is
//! unhealthy while NVML reports it lost, and for `quarantine` after a
//! critical Xid. Xids that are the application's fault (the list NVIDIA's
//! device plugin ignores, [`APPLICATION_XIDS`]) leave the health alone.
//! Unlike NVIDIA's plugin, a GPU recovers: once it answers again and its
//! quarantine is over it is healthy again. Every change is published on a
//! `watch` channel (one `bool` per GPU, in inventory order) within one
//! wait slice.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use tokio::sync::watch;

use crate::gpu::NvmlBackend;

/// Xids caused by the application, not the GPU (graphics engine exception,
/// MMU fault, reset channel verification, preemptive cleanup, video
/// processor exception, context switch timeout fault): 13, 31, 43, 45, 68,
/// 109.
pub const APPLICATION_XIDS: [u64; 6] = [13, 31, 43, 45, 68, 109];

/// Longest single wait for an event; also the probe period.
const WAIT: Duration = Duration::from_millis(100);

/// Whether an Xid makes its GPU unhealthy.
pub fn is_critical(xid: &XidError) -> bool {
    match xid {
        XidError::Value(x) => !APPLICATION_XIDS.contains(x),
        // An Xid NVML cannot tell: assume the worst, as NVIDIA does.
        XidError::Unknown => true,
    }
}

/// The health thread; stops (and is joined) on drop.
#[derive(Debug)]
pub struct HealthWatch {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl HealthWatch {
    /// Starts watching the `count` GPUs of `nvml`; the initial health and
    /// every change go to `tx`.
    pub fn start(
        nvml: Arc<NvmlBackend>,
        count: usize,
        quarantine: Duration,
        tx: watch::Sender<Vec<bool>>,
    ) -> std::io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("tessera-gpu-health".into())
            .spawn(move || run(&nvml, count, quarantine, &tx, &flag))?;
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for HealthWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Per-GPU state.
#[derive(Clone, Copy, Debug, Default)]
struct State {
    lost: bool,
    quarantined_until: Option<Instant>,
}

impl State {
    fn healthy(&self, now: Instant) -> bool {
        !self.lost && self.quarantined_until.is_none_or(|t| now >= t)
    }
}

fn run(
    backend: &NvmlBackend,
    count: usize,
    quarantine: Duration,
    tx: &watch::Sender<Vec<bool>>,
    stop: &AtomicBool,
) {
    let nvml = backend.nvml();
    let set = event_set(nvml, count);
    let mut state: Vec<State> = tx
        .borrow()
        .iter()
        .map(|&healthy| State {
            lost: !healthy,
            quarantined_until: None,
        })
        .collect();
    state.resize(count, State::default());
    while !stop.load(Ordering::Acquire) {
        let start = Instant::now();
        match set.as_ref().map(|s| s.wait(WAIT.as_millis() as u32)) {
            Some(Ok(e)) => {
                let index = e.device.index();
                if let (Ok(i), Some(xid)) = (index, e.event_data.as_ref())
                    && let Some(s) = state.get_mut(i as usize)
                {
                    if is_critical(xid) {
                        tracing::warn!(gpu = i, ?xid, "critical Xid: GPU unhealthy");
                        s.quarantined_until = Some(Instant::now() + quarantine);
                    } else {
                        tracing::info!(gpu = i, ?xid, "application Xid: health unchanged");
                    }
                }
            }
            Some(Err(NvmlError::Timeout)) => {}
            // GPU_IS_LOST (a registered GPU is gone), no event set or any
            // other failure: the probes below tell which GPU.
            Some(Err(_)) | None => sleep_rest(start, stop),
        }
        let now = Instant::now();
        for (i, s) in state.iter_mut().enumerate() {
            s.lost = is_lost(backend, i as u32);
        }
        let health: Vec<bool> = state.iter().map(|s| s.healthy(now)).collect();
        tx.send_if_modified(|old| {
            if *old == health {
                return false;
            }
            tracing::info!(?health, "GPU health changed");
            old.clone_from(&health);
            true
        });
    }
}

/// Sleeps out the rest of one wait slice (so that a failing wait does not
/// spin), waking early on `stop`.
fn sleep_rest(start: Instant, stop: &AtomicBool) {
    while start.elapsed() < WAIT && !stop.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// An event set with critical Xids of every GPU that accepts them (GPUs
/// that refuse are only probed).
fn event_set(nvml: &nvml_wrapper::Nvml, count: usize) -> Option<nvml_wrapper::EventSet<'_>> {
    let mut accepted: Vec<u32> = Vec::new();
    let mut set = nvml.create_event_set().ok()?;
    for i in 0..count as u32 {
        let Ok(d) = nvml.device_by_index(i) else {
            continue;
        };
        match d.register_events(EventTypes::CRITICAL_XID_ERROR, set) {
            Ok(s) => {
                set = s;
                accepted.push(i);
            }
            Err(e) => {
                tracing::warn!(gpu = i, error = %e.error, "no Xid events from this GPU");
                // The set is gone with the failed call: build it again.
                set = nvml.create_event_set().ok()?;
                for &j in &accepted {
                    let d = nvml.device_by_index(j).ok()?;
                    set = d
                        .register_events(EventTypes::CRITICAL_XID_ERROR, set)
                        .ok()?;
                }
            }
        }
    }
    Some(set)
}

/// Whether NVML says GPU `index` has fallen off the bus.
fn is_lost(backend: &NvmlBackend, index: u32) -> bool {
    match backend.nvml().device_by_index(index) {
        Ok(d) => matches!(d.memory_info(), Err(NvmlError::GpuLost)),
        Err(e) => matches!(e, NvmlError::GpuLost),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn application_xids_are_not_critical() {
        for x in APPLICATION_XIDS {
            assert!(!is_critical(&XidError::Value(x)), "{x}");
        }
        for x in [48, 63, 64, 74, 79, 94, 95] {
            assert!(is_critical(&XidError::Value(x)), "{x}");
        }
        assert!(is_critical(&XidError::Unknown));
    }

    #[test]
    fn quarantine_ends_but_loss_does_not() {
        let now = Instant::now();
        let s = State {
            lost: false,
            quarantined_until: Some(now + Duration::from_secs(1)),
        };
        assert!(!s.healthy(now));
        assert!(s.healthy(now + Duration::from_secs(1)));
        let lost = State {
            lost: true,
            quarantined_until: None,
        };
        assert!(!lost.healthy(now + Duration::from_secs(100)));
    }
}
