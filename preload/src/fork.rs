//! Fork safety.
//!
//! A child of a multithreaded process starts with one thread and a copy of
//! every lock as it was at the fork: a lock another thread held then stays
//! held in the child forever, and a one-time initialisation another
//! thread was running never finishes there. So every lock of this library
//! that a CUDA or NVML call may wait on is either held by the forking
//! thread across the fork (taken by the `pthread_atfork` prepare handler,
//! in lock order, released by the parent and child handlers), or is the
//! gate of a [`Once`], which the prepare handler holds as well, so that no
//! initialisation is half-done at the fork.
//!
//! Lock order (every path takes them in this order, the prepare handler
//! too): the [`Once`] gates in the order they were first used, the list
//! of gates, then `primary_ops`, `books`, `registering` (see `state.rs`).
//! No [`Once`] is first used under `primary_ops` (which pre-initialises
//! the driver table), `books` or `registering`; a library constructor the
//! driver's `dlopen` runs under a gate is assumed not to make
//! primary-context calls.

use std::cell::{Cell, RefCell};
use std::ops::Deref;
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};

/// Locks held across a fork by the forking thread. The fields are in the
/// reverse of the order the locks were taken, so dropping releases the
/// state's locks first and the gates last.
pub struct ForkHeld {
    _state: Option<crate::state::ForkHeld>,
    _list: MutexGuard<'static, Vec<&'static Mutex<()>>>,
    _gates: Vec<MutexGuard<'static, ()>>,
}

thread_local! {
    /// What the prepare handler holds (the forking thread's).
    static HELD: RefCell<Option<ForkHeld>> = const { RefCell::new(None) };
}

thread_local! {
    /// How many locks this thread holds while it runs foreign code.
    static HOLDING: Cell<u32> = const { Cell::new(0) };
}

/// A lock guard held while calling foreign code (the driver, a library
/// constructor), which may itself fork. The prepare handler of a thread
/// holding one takes nothing (it would wait for itself forever): such a
/// fork leaves the child as it would be without the handlers.
pub struct Holding<G>(G);

impl<G> Holding<G> {
    /// Marks `guard` as held across foreign code.
    pub fn new(guard: G) -> Self {
        HOLDING.set(HOLDING.get() + 1);
        Self(guard)
    }
}

impl<G> Drop for Holding<G> {
    fn drop(&mut self) {
        HOLDING.set(HOLDING.get().saturating_sub(1));
    }
}

impl<G: Deref> Deref for Holding<G> {
    type Target = G::Target;
    fn deref(&self) -> &G::Target {
        &self.0
    }
}

/// Gates of the [`Once`]s in use, in the order they were first used.
static GATES: Mutex<Vec<&'static Mutex<()>>> = Mutex::new(Vec::new());

/// A value initialised once, like [`OnceLock`], whose initialisation is
/// never half-done in a forked child: it runs under a gate that the fork
/// handlers hold across `fork`.
pub struct Once<T> {
    cell: OnceLock<T>,
    gate: Mutex<()>,
}

impl<T> Default for Once<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> Once<T> {
    /// An uninitialised value.
    pub const fn new() -> Self {
        Self {
            cell: OnceLock::new(),
            gate: Mutex::new(()),
        }
    }

    /// The value, if initialised.
    pub fn get(&self) -> Option<&T> {
        self.cell.get()
    }

    /// The value, initialising it with `f` first if needed. Like
    /// [`OnceLock::get_or_init`], `f` must not initialise this same value.
    #[inline]
    pub fn get_or_init(&'static self, f: impl FnOnce() -> T) -> &'static T {
        match self.cell.get() {
            Some(v) => v,
            None => self.init(f),
        }
    }

    /// The slow path of [`Once::get_or_init`].
    #[cold]
    #[inline(never)]
    fn init(&'static self, f: impl FnOnce() -> T) -> &'static T {
        install();
        {
            let mut gates = GATES.lock().unwrap_or_else(PoisonError::into_inner);
            if !gates.iter().any(|g| std::ptr::eq(*g, &self.gate)) {
                gates.push(&self.gate);
            }
        }
        // The initialisation may run foreign code (`dlopen` runs library
        // constructors).
        let _gate = Holding::new(self.gate.lock().unwrap_or_else(PoisonError::into_inner));
        self.cell.get_or_init(f)
    }
}

/// Registers the fork handlers (once; never waits, so a child forked
/// mid-registration cannot hang here).
pub fn install() {
    static INSTALLED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !INSTALLED.swap(true, std::sync::atomic::Ordering::AcqRel) {
        crate::sys::at_fork(prepare, parent, child);
    }
}

/// Before `fork`: waits for and takes every lock (see the module docs).
/// The gates are taken without holding their list (an initialisation
/// under way may first use another [`Once`]); once every listed gate is
/// held, no initialisation is under way, and holding the list keeps a new
/// one from starting before the fork.
unsafe extern "C" fn prepare() {
    crate::hooks::guard((), || {
        if HOLDING.get() > 0 {
            return;
        }
        let mut gates = Vec::new();
        let list = loop {
            let list = GATES.lock().unwrap_or_else(PoisonError::into_inner);
            if list.len() == gates.len() {
                break list;
            }
            let new: Vec<&'static Mutex<()>> = list[gates.len()..].to_vec();
            drop(list);
            gates.extend(
                new.into_iter()
                    .map(|g| g.lock().unwrap_or_else(PoisonError::into_inner)),
            );
        };
        let held = ForkHeld {
            _state: crate::state::lock_for_fork(),
            _list: list,
            _gates: gates,
        };
        HELD.with(|h| *h.borrow_mut() = Some(held));
    })
}

/// After `fork`, in the parent: releases what [`prepare`] took.
unsafe extern "C" fn parent() {
    crate::hooks::guard((), || {
        HELD.with(|h| drop(h.borrow_mut().take()));
    })
}

/// After `fork`, in the child: releases what [`prepare`] took (the child's
/// copies), then lets the state forget the parent's process (see
/// [`crate::state::forked`]).
unsafe extern "C" fn child() {
    crate::hooks::guard((), || {
        HELD.with(|h| drop(h.borrow_mut().take()));
        crate::state::forked();
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    static SLOW: Once<u32> = Once::new();
    static STARTED: AtomicBool = AtomicBool::new(false);

    #[test]
    fn a_child_forked_during_an_initialisation_finds_it_done() {
        let t = std::thread::spawn(|| {
            *SLOW.get_or_init(|| {
                STARTED.store(true, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(300));
                1
            })
        });
        while !STARTED.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        // SAFETY: the child only reads the value (no allocation, no lock
        // other than the gate the fork handlers released) and exits with
        // _exit.
        let child = unsafe { libc::fork() };
        assert!(child >= 0, "fork failed");
        if child == 0 {
            // SAFETY: alarm and _exit are async-signal-safe.
            unsafe { libc::alarm(5) };
            let v = *SLOW.get_or_init(|| 2);
            // SAFETY: as above.
            unsafe { libc::_exit(if v == 1 { 0 } else { 1 }) };
        }
        let mut status = 0;
        // SAFETY: waits for our own child; status is a valid out-pointer.
        assert_eq!(unsafe { libc::waitpid(child, &mut status, 0) }, child);
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "the child hung or saw another value: status {status:#x}"
        );
        assert_eq!(t.join().unwrap(), 1);
    }
}
