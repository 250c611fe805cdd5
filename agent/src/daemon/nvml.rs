//! The daemon's one NVML: loaded once, by whichever part asks first (the
//! control loop's period, the device plugin, the telemetry writer), and
//! then shared by all of them through an `Arc` — one library handle, one
//! `nvmlInit`.
//!
//! Invariants (enforced here): at most one load attempt runs at a time
//! (the state's lock is held across it), and after a failed one the next
//! starts no sooner than `retry` later, however many parts ask meanwhile;
//! a failure is logged when its message changes and the success once. A
//! loaded NVML is never loaded again (nothing here drops it).

use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::error_chain::with_causes;
use crate::gpu::{GpuError, NvmlBackend};

/// How NVML is loaded: the library, once, by [`SharedNvml::get`].
type Load<T> = Box<dyn Fn() -> Result<T, GpuError> + Send + Sync>;

/// The daemon's NVML (generic only so that its policy can be tested
/// without a library: the daemon uses [`SharedNvml<NvmlBackend>`]).
pub struct SharedNvml<T = NvmlBackend> {
    /// Named in the log.
    lib: PathBuf,
    retry: Duration,
    load: Load<T>,
    state: Mutex<State<T>>,
    /// Wakes the parts waiting in [`SharedNvml::wait_for`] once loaded.
    loaded: watch::Sender<bool>,
}

struct State<T> {
    loaded: Option<Arc<T>>,
    /// The last failure (shared with every caller until the next try).
    error: Option<Arc<GpuError>>,
    next_try: Option<Instant>,
}

impl SharedNvml<NvmlBackend> {
    /// NVML from `lib` (a file name or path), retried every `retry`.
    pub fn new(lib: PathBuf, retry: Duration) -> Self {
        let path = lib.clone();
        Self::with_loader(lib, retry, move || NvmlBackend::load(path.as_os_str()))
    }
}

impl<T: Send + Sync + 'static> SharedNvml<T> {
    /// What `load` returns, retried every `retry`; `lib` names it in the
    /// log.
    pub fn with_loader(
        lib: PathBuf,
        retry: Duration,
        load: impl Fn() -> Result<T, GpuError> + Send + Sync + 'static,
    ) -> Self {
        Self {
            lib,
            retry,
            load: Box::new(load),
            state: Mutex::new(State {
                loaded: None,
                error: None,
                next_try: None,
            }),
            loaded: watch::Sender::new(false),
        }
    }

    /// The loaded NVML; otherwise loads it now when a try is due (this
    /// blocks for as long as `nvmlInit` takes: call it off the async
    /// threads), or returns the last failure.
    pub fn get(&self) -> Result<Arc<T>, Arc<GpuError>> {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = &s.loaded {
            return Ok(n.clone());
        }
        if let (Some(at), Some(e)) = (s.next_try, &s.error)
            && Instant::now() < at
        {
            return Err(e.clone());
        }
        s.next_try = Some(Instant::now() + self.retry);
        match (self.load)() {
            Ok(n) => {
                let n = Arc::new(n);
                tracing::info!(lib = %self.lib.display(), "NVML initialised");
                s.loaded = Some(n.clone());
                s.error = None;
                self.loaded.send_replace(true);
                Ok(n)
            }
            Err(e) => {
                let e = Arc::new(e);
                let msg = with_causes(&*e);
                if s.error
                    .as_ref()
                    .is_none_or(|old| with_causes(&**old) != msg)
                {
                    tracing::warn!(
                        error = %msg,
                        retry_ms = self.retry.as_millis() as u64,
                        "NVML unavailable"
                    );
                }
                s.error = Some(e.clone());
                Err(e)
            }
        }
    }

    /// `ready(&nvml)` once NVML is loaded and `ready` succeeds (run on the
    /// blocking pool, retried on failure at the same interval as the
    /// load, the failure logged as `what`); `None` when `stop` completes
    /// first.
    pub async fn wait_for<R: Send + 'static>(
        self: &Arc<Self>,
        what: &'static str,
        ready: impl Fn(&Arc<T>) -> Result<R, GpuError> + Send + Sync + 'static,
        stop: impl Future<Output = ()>,
    ) -> Option<R> {
        tokio::pin!(stop);
        let ready = Arc::new(ready);
        let mut loaded = self.loaded.subscribe();
        let mut failed = String::new();
        loop {
            let (me, ready) = (self.clone(), ready.clone());
            let attempt = tokio::task::spawn_blocking(move || match me.get() {
                Ok(n) => ready(&n).map_err(|e| Some(with_causes(&e))),
                // Logged by `get`.
                Err(_) => Err(None),
            })
            .await;
            match attempt {
                Ok(Ok(r)) => return Some(r),
                Ok(Err(None)) => {}
                Ok(Err(Some(msg))) => {
                    if msg != failed {
                        tracing::warn!(
                            error = %msg,
                            retry_ms = self.retry.as_millis() as u64,
                            "{what}: NVML does not answer"
                        );
                    }
                    failed = msg;
                }
                Err(e) => tracing::error!(error = %e, "{what}: NVML loading panicked"),
            }
            tokio::select! {
                () = &mut stop => return None,
                () = tokio::time::sleep(self.retry) => {}
                // Loaded by another part meanwhile: go on at once.
                Ok(()) = loaded.changed(), if failed.is_empty() => {}
            }
        }
    }
}

impl<T> std::fmt::Debug for SharedNvml<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedNvml")
            .field("lib", &self.lib)
            .field("retry", &self.retry)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// A loader failing `fails` times, then handing out a fresh value
    /// per load; counts its calls.
    fn counted(fails: u32) -> (Arc<SharedNvml<u32>>, Arc<AtomicU32>) {
        let calls = Arc::new(AtomicU32::new(0));
        let c = calls.clone();
        let nvml =
            SharedNvml::with_loader("libtest.so".into(), Duration::from_secs(5), move || {
                let n = c.fetch_add(1, Ordering::SeqCst);
                if n < fails {
                    Err(GpuError::Init {
                        library: "libtest.so".into(),
                        source: nvml_wrapper::error::NvmlError::DriverNotLoaded,
                    })
                } else {
                    Ok(n)
                }
            });
        (Arc::new(nvml), calls)
    }

    #[tokio::test(start_paused = true)]
    async fn every_part_gets_the_one_handle_loaded_once() {
        let (nvml, calls) = counted(0);
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let nvml = nvml.clone();
                tokio::spawn(async move {
                    nvml.wait_for("test", |_| Ok(()), std::future::pending())
                        .await
                        .unwrap();
                    nvml.get().unwrap()
                })
            })
            .collect();
        let direct = nvml.get().unwrap();
        for w in waiters {
            assert!(Arc::ptr_eq(&w.await.unwrap(), &direct));
        }
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn failures_are_retried_once_per_interval_whoever_asks() {
        let (nvml, calls) = counted(2);
        let t0 = Instant::now();
        // Two waiters and a caller polling every 100 ms, for 12 s: the
        // load runs at 0, 5 and 10 s only.
        let waiters: Vec<_> = (0..2)
            .map(|_| {
                let nvml = nvml.clone();
                tokio::spawn(async move {
                    nvml.wait_for(
                        "test",
                        |n| Ok((**n, Instant::now())),
                        std::future::pending(),
                    )
                    .await
                    .unwrap()
                })
            })
            .collect();
        while t0.elapsed() < Duration::from_secs(12) {
            let _ = nvml.get();
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(calls.load(Ordering::SeqCst), 3);
        for w in waiters {
            let (value, at) = w.await.unwrap();
            assert_eq!(value, 2, "the value of the one successful load");
            assert!(at - t0 >= Duration::from_secs(10), "{:?}", at - t0);
            assert!(at - t0 < Duration::from_millis(10_200), "{:?}", at - t0);
        }
        let e = counted(1).0.get().unwrap_err();
        assert!(
            with_causes(&*e).contains("libtest.so"),
            "{}",
            with_causes(&*e)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_stops_with_the_daemon() {
        let (nvml, calls) = counted(u32::MAX);
        let (tx, mut rx) = watch::channel(false);
        let w = tokio::spawn(async move {
            nvml.wait_for("test", |_| Ok(()), async move {
                let _ = rx.wait_for(|s| *s).await;
            })
            .await
        });
        tokio::time::sleep(Duration::from_secs(7)).await;
        tx.send(true).unwrap();
        assert_eq!(w.await.unwrap(), None);
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }
}
