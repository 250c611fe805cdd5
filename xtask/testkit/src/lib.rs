//! Test helpers shared by Tessera's crates, so no test includes another
//! crate's files by path. They depend only downward (the simulator, the
//! region ABI): helpers for one crate's tests live with that crate's
//! tests (the agent's controller and eBPF helpers in
//! `agent/tests/{control,ebpf}_support`).
//!
//! - [`sim`]: the built artifacts, a private simulated node per test, and
//!   the simulator's C workload (used by the simulator's, the interposer's
//!   and the agent's tests);
//! - [`poll`]: waiting for a condition, and GET from a local HTTP
//!   endpoint (also the demo's reader of the agent's view);
//! - [`programs`]: finding a program on `PATH`;
//! - [`python`]: Python environments under `target/` (CuPy, pynvml,
//!   PyTorch) made by pip on first use, and step-wise scripts;
//! - [`promtool`]: `promtool check metrics`, the judge of `/metrics` texts;
//! - [`helm`] (feature `helm`): the Helm chart rendered and packaged
//!   through the Helm SDK, its objects checked against the Kubernetes
//!   schemas;
//! - [`apiserver`] (feature `apiserver`): a scripted fake Kubernetes API
//!   server behind a real `kube::Client`, and its pods.
//!
//! The skip convention of the workspace: a test that cannot run prints one
//! line containing `skipped: <reason>` and returns ([`skip_if!`],
//! [`or_skip!`]); `cargo xtask test` shows those lines and, under
//! `CI=true`, fails the run on them (`xtask/src/skips.rs`).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test helpers fail the calling test on purpose"
)]

#[cfg(feature = "apiserver")]
pub mod apiserver;
#[cfg(feature = "helm")]
pub mod helm;
pub mod poll;
pub mod programs;
pub mod promtool;
pub mod python;
pub mod sim;

/// Returns from the calling test, printing `skipped: <why>`, when `$why`
/// (an `Option<String>`) is `Some`; with a second argument, returns that.
#[macro_export]
macro_rules! skip_if {
    ($why:expr $(, $ret:expr)?) => {
        if let Some(why) = $why {
            eprintln!("skipped: {why}");
            return $($ret)?;
        }
    };
}

/// The `Ok` value of `$result`, a `Result<T, String>`; on `Err(why)`
/// returns from the calling test, printing `skipped: <why>`.
#[macro_export]
macro_rules! or_skip {
    ($result:expr) => {
        match $result {
            Ok(value) => value,
            Err(why) => {
                eprintln!("skipped: {why}");
                return;
            }
        }
    };
}
