//! The control writer in a separate process, as the agent is: stopped
//! (SIGSTOP) at arbitrary moments it never makes a reader return a mix of
//! two writes, nor wait for it; killed (SIGKILL) at arbitrary moments while
//! creating the file it never leaves a half-written control file.
#![allow(clippy::unwrap_used)] // helpers of a test crate

use std::time::{Duration, Instant};

use tessera_region::RegionError;
use tessera_region::control::{ControlSpec, GpuLimits};
use tessera_region::error::PathIoError;
use tessera_region::file::{CONTROL_FILE, create_control, open_control, open_control_rw};
use tessera_region::layout::CONTROL_SIZE;

/// Limits derived from `k`; the GPU count changes with `k`, so a mix of two
/// writes matches neither.
fn spec_of(k: u64) -> ControlSpec {
    ControlSpec {
        flags: (k % 2) as u32,
        gpus: (0..1 + k % 4)
            .map(|i| GpuLimits {
                uuid: [(k as u8).wrapping_mul(16).wrapping_add(i as u8); 16],
                memory_limit: k << 20 | i,
                context_overhead: k << 8 | i,
                launch_rate: k * 1000 + i,
                launch_burst: k * 10 + i,
                launch_floor: k * 7 + i,
            })
            .collect(),
    }
}

mod sys {
    /// Forks a child that runs `child` forever (it never returns).
    pub fn fork(child: impl FnOnce()) -> libc::pid_t {
        // SAFETY: the child only stores into a shared mapping made before
        // the fork and loops; it never returns into the test harness.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            child();
            // SAFETY: leaves the child without running the parent's
            // atexit handlers.
            unsafe { libc::_exit(0) };
        }
        pid
    }

    /// Sends `sig` to `pid`.
    pub fn kill(pid: libc::pid_t, sig: libc::c_int) {
        // SAFETY: a plain syscall on our own child.
        assert_eq!(unsafe { libc::kill(pid, sig) }, 0);
    }

    /// Waits until `pid` has stopped (`stopped`) or exited.
    pub fn wait(pid: libc::pid_t, stopped: bool) {
        let mut status = 0;
        let flags = if stopped { libc::WUNTRACED } else { 0 };
        // SAFETY: waits for our own child; `status` is a valid out pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, flags) };
        assert_eq!(r, pid);
        if stopped {
            assert!(libc::WIFSTOPPED(status), "status {status:#x}");
        }
    }
}

/// Panics unless the snapshot is exactly one of [`spec_of`]'s.
fn assert_whole(s: &tessera_region::ControlSnapshot, what: &str) {
    let k = s.gpus.first().map_or(0, |g| g.memory_limit >> 20);
    let want = spec_of(k);
    assert!(
        s.gpus == want.gpus && s.flags == want.flags,
        "{what}: a mixed view {s:?}"
    );
}

fn spin_for(d: Duration) {
    let until = Instant::now() + d;
    while Instant::now() < until {
        std::hint::spin_loop();
    }
}

fn u64_at(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().unwrap())
}

#[test]
fn readers_never_see_a_mix_while_the_writer_is_stopped() {
    let dir = tempfile::tempdir().unwrap();
    create_control(dir.path(), &spec_of(1)).unwrap();
    let writer = open_control_rw(dir.path()).unwrap();
    let child = sys::fork(|| {
        let mut k = 2u64;
        loop {
            let _ = writer.write(&spec_of(k));
            k += 1;
        }
    });
    drop(writer);
    let path = dir.path().join(CONTROL_FILE);
    let reader = open_control(&path).unwrap();
    let rounds = 300;
    let mut mid_write = 0;
    let mut failure = None;
    for round in 0..rounds {
        sys::kill(child, libc::SIGSTOP);
        sys::wait(child, true);
        // Epoch (24) and backup epoch (32) as the stopped writer left them.
        let bytes = std::fs::read(&path).unwrap();
        if u64_at(&bytes, 24) % 2 == 1 || u64_at(&bytes, 32) % 2 == 1 {
            mid_write += 1;
        }
        for _ in 0..3 {
            let t = Instant::now();
            let s = reader.snapshot();
            let waited = t.elapsed();
            let k = s.gpus.first().map_or(0, |g| g.memory_limit >> 20);
            let want = spec_of(k);
            if s.gpus != want.gpus || s.flags != want.flags {
                failure = Some(format!("round {round}: a mixed view {s:?}"));
            } else if waited > Duration::from_secs(1) {
                failure = Some(format!(
                    "round {round}: waited {waited:?} for a stopped writer"
                ));
            }
        }
        sys::kill(child, libc::SIGCONT);
        if failure.is_some() {
            break;
        }
        // Let it run a varying while, so it stops at varying stores.
        let until = Instant::now() + Duration::from_micros(50 + (round * 37) % 400);
        while Instant::now() < until {
            std::hint::spin_loop();
        }
    }
    sys::kill(child, libc::SIGKILL);
    sys::wait(child, false);
    if let Some(f) = failure {
        panic!("{f}");
    }
    println!("{mid_write} of {rounds} stops caught the writer mid-write");
    assert!(
        mid_write >= rounds / 20,
        "only {mid_write} of {rounds} stops caught the writer mid-write: the test proves little"
    );
}

#[test]
fn a_create_killed_at_any_moment_leaves_no_half_written_control() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(CONTROL_FILE);
    let rounds = 200u64;
    let mut mid_create = 0;
    for round in 0..rounds {
        let d = dir.path().to_path_buf();
        let child = sys::fork(move || {
            let mut k = round * 100_000;
            loop {
                if k % 3 == 0 {
                    let _ = std::fs::remove_file(d.join(CONTROL_FILE));
                }
                let _ = create_control(&d, &spec_of(k));
                k += 1;
            }
        });
        spin_for(Duration::from_micros(200 + (round * 53) % 1500));
        sys::kill(child, libc::SIGKILL);
        sys::wait(child, false);
        let left_temporary = std::fs::read_dir(dir.path())
            .unwrap()
            .any(|e| e.unwrap().file_name() != CONTROL_FILE);
        if left_temporary {
            mid_create += 1;
        }
        let what = format!("round {round}");
        match open_control(&path) {
            // Killed between removing the file and publishing the new one.
            Err(RegionError::Io(PathIoError { source, .. }))
                if source.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => panic!("{what}: a half-written control file: {e}"),
            Ok(c) => {
                c.validate(CONTROL_SIZE)
                    .unwrap_or_else(|e| panic!("{what}: a half-written control file: {e}"));
                let t = Instant::now();
                let s = c.snapshot();
                assert!(t.elapsed() < Duration::from_secs(1), "{what}: waited");
                assert_whole(&s, &what);
            }
        }
    }
    println!("{mid_create} of {rounds} kills caught a create midway");
    assert!(
        mid_create >= rounds / 20,
        "only {mid_create} of {rounds} kills caught a create midway: the test proves little"
    );
}
