//! Opening (or creating) the node-wide state file and locking its GPUs.
//!
//! The file lives at `GPUSIM_STATE` (default `/dev/shm/gpusim-<uid>.state`)
//! and is shared by every process using the simulated node. The first
//! process creates it from the node description (`GPUSIM_NODE`, or the
//! default node) in a temporary file and publishes it with `link(2)`, so
//! nobody ever sees a half-initialised file. Later processes check its magic,
//! version and sizes, and read the node description stored inside; if they
//! were given a different description they refuse to start rather than
//! disagree about the node.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use crate::layout::{
    GpuInner, GpuShared, Header, MAX_GPUS, NODE_TEXT_MAX, STATE_MAGIC, STATE_VERSION, gpu_offset,
    total_size,
};
use crate::node::{NodeDescription, NodeError};
use crate::sys::{self, LockError, Locked, Mapping};

/// Environment variable naming the node description file.
pub const ENV_NODE: &str = "GPUSIM_NODE";
/// Environment variable naming the state file.
pub const ENV_STATE: &str = "GPUSIM_STATE";

/// Why the state could not be opened or used.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// The node description is unusable.
    #[error(transparent)]
    Node(#[from] NodeError),
    /// An I/O operation on the state file failed.
    #[error("cannot {action} state file {path}")]
    Io {
        /// What was attempted (`open`, `create`, `map`, ...).
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// The file is not a state file of this version.
    #[error(
        "state file {path} is unusable: {problem}; remove it with `gpusim reset` (or point {ENV_STATE} elsewhere)"
    )]
    Incompatible {
        /// The file.
        path: PathBuf,
        /// What does not match.
        problem: String,
    },
    /// The file describes another node than the one asked for.
    #[error(
        "state file {path} was created for a different node description than {node}; run `gpusim reset` or point {ENV_STATE} elsewhere"
    )]
    NodeMismatch {
        /// The file.
        path: PathBuf,
        /// The description asked for.
        node: PathBuf,
    },
    /// The file was created by an earlier boot (replaced automatically).
    #[error("state file {path} was created by an earlier boot")]
    Stale {
        /// The file.
        path: PathBuf,
    },
    /// The file is not this user's own, or others may write it (and root
    /// does not share it, see `root_shares`).
    #[error(
        "state file {path} is not safe to use: {problem}; remove it or point {ENV_STATE} elsewhere"
    )]
    Unsafe {
        /// The file.
        path: PathBuf,
        /// Owner or mode problem.
        problem: String,
    },
    /// A GPU's lock was left unusable: a process recovered it from a dead
    /// owner and released it without marking it consistent.
    #[error(
        "the lock of GPU {gpu} in state file {path} is not recoverable; run `gpusim reset --remove` (processes using the node must restart)"
    )]
    Unrecoverable {
        /// GPU index.
        gpu: usize,
        /// The file.
        path: PathBuf,
    },
    /// A GPU's lock is held by a stopped or frozen thread.
    #[error(
        "GPU {gpu} in state file {path} is held by thread {tid}, which is stopped or frozen; not waiting for it"
    )]
    HolderSuspended {
        /// GPU index.
        gpu: usize,
        /// The file.
        path: PathBuf,
        /// The holder's thread id.
        tid: i32,
    },
    /// A GPU's lock could not be taken.
    #[error("cannot lock GPU {gpu} in state file {path}")]
    Lock {
        /// GPU index.
        gpu: usize,
        /// The file.
        path: PathBuf,
        /// Cause.
        #[source]
        source: io::Error,
    },
}

/// Where the node description and state file are.
#[derive(Clone, Debug)]
pub struct Config {
    /// Node description; `None` means the stored one, or the default node.
    pub node_path: Option<PathBuf>,
    /// State file.
    pub state_path: PathBuf,
}

impl Config {
    /// From `GPUSIM_NODE` and `GPUSIM_STATE`.
    pub fn from_env() -> Self {
        Self {
            node_path: std::env::var_os(ENV_NODE)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from),
            state_path: std::env::var_os(ENV_STATE)
                .filter(|v| !v.is_empty())
                .map_or_else(default_state_path, PathBuf::from),
        }
    }

    /// The node description processes use: the one stored in an existing
    /// state file, else the given file, else the default node. Creates no
    /// state file (one left by an earlier boot is removed, as opening would).
    pub fn effective_node(&self) -> Result<NodeDescription, StateError> {
        let wanted = self.wanted_node()?;
        Ok(match State::open_existing(self, wanted.as_ref())? {
            Some(state) => state.node,
            None => wanted.unwrap_or_else(NodeDescription::default_node),
        })
    }

    /// The given node description, read and validated.
    fn wanted_node(&self) -> Result<Option<NodeDescription>, StateError> {
        Ok(self
            .node_path
            .as_deref()
            .map(NodeDescription::from_file)
            .transpose()?)
    }
}

/// `/dev/shm/gpusim-<uid>.state` (the effective uid).
pub fn default_state_path() -> PathBuf {
    PathBuf::from(format!("/dev/shm/gpusim-{}.state", sys::euid()))
}

/// Whether a state file owned by `owner` at `path` is one that root shares
/// with other users on purpose (a node's file handed to containers that
/// run as other uids), usable by every user whatever its mode: root owns
/// it and it was named explicitly (`GPUSIM_STATE`, not the per-user
/// default). Only root can have given others write access to such a
/// file; what a writer could do with it is confuse the simulated node
/// (its description, its locks), not act as the processes using it (the
/// stand-ins they open are opened as themselves).
fn root_shares(owner: u32, path: &Path) -> bool {
    owner == 0 && path != default_state_path()
}

/// The mapped state file.
pub struct State {
    map: Mapping,
    node: NodeDescription,
    path: PathBuf,
    gpus: usize,
}

impl State {
    /// Opens the state file, creating it if needed.
    pub fn open(cfg: &Config) -> Result<Self, StateError> {
        let wanted = cfg.wanted_node()?;
        let path = &cfg.state_path;
        for _ in 0..5 {
            match Self::open_existing(cfg, wanted.as_ref())? {
                Some(state) => return Ok(state),
                None => {
                    let node = wanted.clone().unwrap_or_else(NodeDescription::default_node);
                    Self::create(path, &node)?;
                }
            }
        }
        Err(StateError::Io {
            action: "open",
            path: path.clone(),
            source: io::Error::other("it keeps disappearing while being opened"),
        })
    }

    /// Opens the state file if there is one, checking it was made for
    /// `wanted` (the given description, if any). `None` when there is none
    /// or only one left by an earlier boot, which is removed: nothing can be
    /// using it.
    fn open_existing(
        cfg: &Config,
        wanted: Option<&NodeDescription>,
    ) -> Result<Option<Self>, StateError> {
        let path = &cfg.state_path;
        let file = match OpenOptions::new().read(true).write(true).open(path) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(source) => {
                return Err(StateError::Io {
                    action: "open",
                    path: path.clone(),
                    source,
                });
            }
        };
        let state = match Self::attach(file, path) {
            Err(StateError::Stale { .. }) => {
                let _ = fs::remove_file(path);
                return Ok(None);
            }
            other => other?,
        };
        if let (Some(w), Some(np)) = (wanted, &cfg.node_path)
            && w.canonical() != state.node.canonical()
        {
            return Err(StateError::NodeMismatch {
                path: path.clone(),
                node: np.clone(),
            });
        }
        Ok(Some(state))
    }

    /// Writes a fresh state file for `node` and publishes it at `path`
    /// unless another process got there first.
    fn create(path: &Path, node: &NodeDescription) -> Result<(), StateError> {
        let io_err = |action, source| StateError::Io {
            action,
            path: path.to_path_buf(),
            source,
        };
        let text = node.canonical();
        if text.len() > NODE_TEXT_MAX {
            return Err(StateError::Incompatible {
                path: path.to_path_buf(),
                problem: format!(
                    "the node description needs {} bytes; at most {NODE_TEXT_MAX} fit",
                    text.len()
                ),
            });
        }
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            fs::create_dir_all(dir).map_err(|e| io_err("create the folder of", e))?;
        }
        let tmp = path.with_file_name(format!(
            ".{}.tmp.{}.{}",
            path.file_name()
                .map_or("state".into(), |n| n.to_string_lossy()),
            std::process::id(),
            sys::monotonic_ns()
        ));
        let result = (|| {
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&tmp)
                .map_err(|e| io_err("create", e))?;
            let gpus = node.gpu.len();
            let size = total_size(gpus);
            file.set_len(size as u64).map_err(|e| io_err("size", e))?;
            let map = Mapping::map(&file, size).map_err(|e| io_err("map", e))?;
            // SAFETY: the mapping is at least `size` bytes, page aligned and
            // private to this process until it is linked into place.
            unsafe { init(&map, node, &text) }.map_err(|e| io_err("initialise", e))?;
            drop(map);
            match fs::hard_link(&tmp, path) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
                Err(e) => Err(io_err("publish", e)),
            }
        })();
        let _ = fs::remove_file(&tmp);
        result
    }

    fn attach(file: File, path: &Path) -> Result<Self, StateError> {
        let bad = |problem: String| StateError::Incompatible {
            path: path.to_path_buf(),
            problem,
        };
        let meta = file.metadata().map_err(|source| StateError::Io {
            action: "stat",
            path: path.to_path_buf(),
            source,
        })?;
        // Its node description names devices this process opens and
        // ioctls, and its mutexes gate every call: only our own file will
        // do, or one root shares on purpose (see `root_shares`).
        let me = sys::euid();
        let (owner, mode) = (
            std::os::unix::fs::MetadataExt::uid(&meta),
            std::os::unix::fs::MetadataExt::mode(&meta),
        );
        let shared = root_shares(owner, path);
        if owner != me && !shared {
            return Err(StateError::Unsafe {
                path: path.to_path_buf(),
                problem: format!("it belongs to uid {owner}, not to uid {me}"),
            });
        }
        if mode & 0o022 != 0 && !shared {
            return Err(StateError::Unsafe {
                path: path.to_path_buf(),
                problem: format!("its mode {:o} lets others write it", mode & 0o777),
            });
        }
        let len = meta.len() as usize;
        if len < gpu_offset() {
            return Err(bad(format!(
                "it is {len} bytes, shorter than a header ({} bytes)",
                gpu_offset()
            )));
        }
        let map = Mapping::map(&file, len).map_err(|source| StateError::Io {
            action: "map",
            path: path.to_path_buf(),
            source,
        })?;
        // SAFETY: the mapping is at least gpu_offset() >= size_of::<Header>()
        // bytes and page aligned; Header is valid for any bit pattern except
        // that we only read its integer fields and byte array.
        let h = unsafe { &*(map.as_ptr() as *const Header) };
        if h.magic != STATE_MAGIC {
            return Err(bad("it does not start with the gpusim magic".into()));
        }
        if h.version != STATE_VERSION {
            return Err(bad(format!(
                "it has layout version {}, this gpusim uses version {STATE_VERSION}",
                h.version
            )));
        }
        if h.header_size as usize != size_of::<Header>()
            || h.gpu_size as usize != size_of::<GpuShared>()
        {
            return Err(bad(format!(
                "its structures have other sizes (header {}, gpu {}) than this build's ({}, {})",
                h.header_size,
                h.gpu_size,
                size_of::<Header>(),
                size_of::<GpuShared>()
            )));
        }
        let gpus = h.gpu_count as usize;
        if !(1..=MAX_GPUS).contains(&gpus)
            || total_size(gpus) != len
            || h.total_size as usize != len
        {
            return Err(bad(format!(
                "it claims {gpus} GPUs and {} bytes but is {len} bytes",
                h.total_size
            )));
        }
        let node_len = h.node_len as usize;
        if node_len > NODE_TEXT_MAX {
            return Err(bad(format!(
                "its node description length {node_len} is too large"
            )));
        }
        if h.boot_id != boot_id() {
            return Err(StateError::Stale {
                path: path.to_path_buf(),
            });
        }
        let text = std::str::from_utf8(&h.node[..node_len])
            .map_err(|_| bad("its node description is not UTF-8".into()))?;
        let node: NodeDescription = serde_json::from_str(text)
            .map_err(|e| bad(format!("its node description does not parse: {e}")))?;
        node.validate(path)?;
        if node.gpu.len() != gpus {
            return Err(bad(format!(
                "its node description has {} GPUs but the file holds {gpus}",
                node.gpu.len()
            )));
        }
        Ok(Self {
            map,
            node,
            path: path.to_path_buf(),
            gpus,
        })
    }

    /// The node this state belongs to.
    pub fn node(&self) -> &NodeDescription {
        &self.node
    }

    /// Where the state file is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Number of GPUs.
    pub fn gpu_count(&self) -> usize {
        self.gpus
    }

    /// Bumped by every in-place reset.
    pub fn generation(&self) -> u64 {
        self.header().generation.load(Ordering::Acquire)
    }

    /// Marks an in-place reset.
    pub fn bump_generation(&self) {
        self.header().generation.fetch_add(1, Ordering::AcqRel);
    }

    fn header(&self) -> &Header {
        // SAFETY: validated in attach(); the mapping lives as long as self.
        unsafe { &*(self.map.as_ptr() as *const Header) }
    }

    /// GPU `i`'s block. Panics if `i` is out of range.
    pub fn gpu(&self, i: usize) -> &GpuShared {
        assert!(i < self.gpus, "gpu index {i} out of range");
        // SAFETY: attach() checked the file holds `gpus` blocks at
        // gpu_offset(), each size_of::<GpuShared>() bytes and 4096-aligned.
        unsafe {
            &*(self
                .map
                .as_ptr()
                .add(gpu_offset() + i * size_of::<GpuShared>()) as *const GpuShared)
        }
    }

    /// Locks GPU `i` (recovering the lock if its holder died; the guard's
    /// `recovered` says so, and the caller must then repair what the dead
    /// holder may have left half-written).
    pub fn lock(&self, i: usize) -> Result<GpuGuard<'_>, StateError> {
        let gpu = self.gpu(i);
        // SAFETY: the mutex was initialised at creation and stays mapped
        // while the guard (which borrows self) lives.
        let locked = unsafe { sys::mutex_lock(gpu.lock.mutex.get()) }.map_err(|e| match e {
            LockError::NotRecoverable => StateError::Unrecoverable {
                gpu: i,
                path: self.path.clone(),
            },
            LockError::HolderSuspended { tid } => StateError::HolderSuspended {
                gpu: i,
                path: self.path.clone(),
                tid,
            },
            LockError::Os(source) => StateError::Lock {
                gpu: i,
                path: self.path.clone(),
                source,
            },
        })?;
        Ok(GpuGuard {
            gpu,
            recovered: locked == Locked::OwnerDied,
            _not_send: PhantomData,
        })
    }
}

/// Writes header and mutexes into a fresh mapping.
///
/// # Safety
/// `map` must be at least `total_size(node.gpu.len())` bytes, zero-filled and
/// not shared with any other process yet.
unsafe fn init(map: &Mapping, node: &NodeDescription, text: &str) -> io::Result<()> {
    let gpus = node.gpu.len();
    // SAFETY: per the contract, the header fits and nobody else sees it.
    let h = unsafe { &mut *(map.as_ptr() as *mut Header) };
    h.magic = STATE_MAGIC;
    h.version = STATE_VERSION;
    h.header_size = size_of::<Header>() as u32;
    h.gpu_size = size_of::<GpuShared>() as u64;
    h.total_size = total_size(gpus) as u64;
    h.gpu_count = gpus as u32;
    h.node_len = text.len() as u32;
    h.node[..text.len()].copy_from_slice(text.as_bytes());
    h.boot_id = boot_id();
    for i in 0..gpus {
        // SAFETY: block i lies inside the mapping (see total_size).
        let g = unsafe {
            &*(map.as_ptr().add(gpu_offset() + i * size_of::<GpuShared>()) as *const GpuShared)
        };
        // SAFETY: the mutex memory is ours alone until publication.
        unsafe { sys::mutex_init(g.lock.mutex.get()) }?;
    }
    Ok(())
}

/// A locked GPU; dereferences to its guarded state.
pub struct GpuGuard<'a> {
    gpu: &'a GpuShared,
    /// The previous holder died while holding the lock.
    pub recovered: bool,
    _not_send: PhantomData<*const ()>,
}

impl GpuGuard<'_> {
    /// The GPU's lost flag.
    pub fn lost(&self) -> bool {
        self.gpu.lost.load(Ordering::Acquire) != 0
    }
}

impl Deref for GpuGuard<'_> {
    type Target = GpuInner;
    fn deref(&self) -> &GpuInner {
        // SAFETY: the lock is held for the guard's lifetime, so no other
        // thread or process touches `inner`.
        unsafe { &*self.gpu.inner.get() }
    }
}

impl DerefMut for GpuGuard<'_> {
    fn deref_mut(&mut self) -> &mut GpuInner {
        // SAFETY: as in deref; &mut self makes this the only reference.
        unsafe { &mut *self.gpu.inner.get() }
    }
}

impl Drop for GpuGuard<'_> {
    fn drop(&mut self) {
        // SAFETY: this thread locked the mutex in State::lock.
        unsafe { sys::mutex_unlock(self.gpu.lock.mutex.get()) }
    }
}

/// This boot's id (`/proc/sys/kernel/random/boot_id`; zeros if unknown).
pub fn boot_id() -> [u8; 36] {
    let mut id = [0u8; 36];
    if let Ok(text) = fs::read_to_string("/proc/sys/kernel/random/boot_id") {
        let t = text.trim().as_bytes();
        let n = t.len().min(36);
        id[..n].copy_from_slice(&t[..n]);
    }
    id
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A state file of the default node in a temporary folder (kept while
    /// the folder is).
    fn fresh_state() -> (tempfile::TempDir, State) {
        let dir = tempfile::tempdir().unwrap();
        let cfg = Config {
            node_path: None,
            state_path: dir.path().join("state"),
        };
        let state = State::open(&cfg).unwrap();
        (dir, state)
    }

    /// A file others may write is refused, unless root owns it and it was
    /// named explicitly (as a node's file handed to containers).
    #[test]
    fn a_shared_file_is_usable_only_when_root_shares_it() {
        use std::os::unix::fs::PermissionsExt;
        let (dir, state) = fresh_state();
        drop(state);
        let path = dir.path().join("state");
        fs::set_permissions(&path, fs::Permissions::from_mode(0o666)).unwrap();
        let cfg = Config {
            node_path: None,
            state_path: path.clone(),
        };
        let opened = State::open(&cfg);
        if sys::euid() == 0 {
            assert!(opened.is_ok(), "{:?}", opened.err());
        } else {
            assert!(
                matches!(opened, Err(StateError::Unsafe { .. })),
                "a user's own file others may write"
            );
        }
        assert!(root_shares(0, &path));
        assert!(!root_shares(1000, &path));
        assert!(!root_shares(0, &default_state_path()));
    }

    fn node_file(dir: &Path, name: &str, cuda_version: i32) -> PathBuf {
        let path = dir.join(name);
        let text = format!(
            "cuda_version = {cuda_version}\n[[gpu]]\nmodel = \"x\"\nmemory_mib = 1024\nsm_count = 8\n"
        );
        fs::write(&path, text).unwrap();
        path
    }

    /// A driver call waits for a stopped holder that goes on (a throttled
    /// neighbour is thawed again) instead of failing.
    #[test]
    fn a_driver_call_waits_for_a_holder_that_goes_on() {
        let (_dir, state) = fresh_state();
        let pid = sys::stopped_child(|| std::mem::forget(state.lock(0).unwrap()));
        let resume = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(800));
            // SAFETY: continues, then reaps, our own stopped child (which
            // exits at once, holding the lock).
            unsafe {
                libc::kill(pid, libc::SIGCONT);
                libc::waitpid(pid, std::ptr::null_mut(), 0);
            }
        });
        let start = std::time::Instant::now();
        let got = state
            .lock(0)
            .expect("a driver call gave up on a holder that went on");
        assert!(start.elapsed() >= std::time::Duration::from_millis(700));
        assert!(got.recovered, "the holder exited holding it");
        drop(got);
        resume.join().unwrap();
    }

    #[test]
    fn locking_a_gpu_this_thread_holds_fails_instead_of_hanging() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = Config {
            node_path: None,
            state_path: dir.path().join("state"),
        };
        // Leaked, so that a hanging thread cannot hang the test with it.
        let state: &'static State = Box::leak(Box::new(State::open(&cfg).unwrap()));
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let held = state.lock(0).unwrap();
            let again = state.lock(0).map(|_| ()).map_err(|e| e.to_string());
            drop(held);
            let _ = tx.send(again);
        });
        let again = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("the second lock hung");
        let err = again.expect_err("a held lock was locked again");
        assert!(err.contains("cannot lock GPU 0"), "{err}");
        // Released properly: it locks again.
        assert!(!state.lock(0).unwrap().recovered);
    }

    /// A holder in another pid namespace whose thread has this thread's
    /// number (two containers' main threads are both tid 1) is waited
    /// for, not taken for this thread.
    #[test]
    fn a_holder_elsewhere_with_this_threads_number_is_waited_for() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = Config {
            node_path: None,
            state_path: dir.path().join("state"),
        };
        let state: &'static State = Box::leak(Box::new(State::open(&cfg).unwrap()));
        let me = sys::gettid();
        let m = state.gpu(0).lock.mutex.get() as usize;
        let child = std::thread::spawn(move || {
            sys::in_child(|| {
                let g = state.lock(0).unwrap();
                let m = m as *mut libc::pthread_mutex_t;
                // SAFETY: this thread holds the mutex and writes its own
                // tid back before unlocking it.
                unsafe { sys::set_holder(m, me) };
                std::thread::sleep(std::time::Duration::from_millis(300));
                // SAFETY: as above.
                unsafe { sys::set_holder(m, sys::gettid()) };
                drop(g);
            })
        });
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        // SAFETY: the mutex stays mapped (the state is leaked).
        while unsafe { sys::holder(m as *mut libc::pthread_mutex_t) } != me {
            assert!(std::time::Instant::now() < deadline, "never held as {me}");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let g = state.lock(0).map_err(|e| e.to_string());
        assert!(g.is_ok(), "{:?}", g.err());
        drop(g);
        assert_eq!(child.join().unwrap(), 0, "the child failed");
    }

    /// A holder stopped inside its critical section (a stop signal, a
    /// frozen cgroup) would hold every other process of the node, the node
    /// agent's NVML queries included, for as long as it stays stopped: a
    /// monitoring query gives up with an error naming the holder instead,
    /// and at once the next time while it stays stopped.
    #[test]
    fn a_stopped_holder_is_given_up_on_instead_of_waited_for() {
        let (_dir, state) = fresh_state();
        let pid = sys::stopped_child(|| std::mem::forget(state.lock(0).unwrap()));
        let monitor = || sys::with_patience(sys::Patience::Monitor, || state.lock(0).err());
        let start = std::time::Instant::now();
        let err = monitor().expect("the stopped holder's lock was taken");
        let waited = start.elapsed();
        assert!(
            matches!(err, StateError::HolderSuspended { gpu: 0, tid, .. } if tid == pid),
            "{err:?}"
        );
        assert!(err.to_string().contains("stopped or frozen"), "{err}");
        assert!(
            waited >= std::time::Duration::from_nanos(sys::SUSPENDED_HOLDER_NS)
                && waited < std::time::Duration::from_secs(5),
            "gave up after {waited:?}"
        );
        let start = std::time::Instant::now();
        assert!(monitor().is_some());
        assert!(
            start.elapsed() < std::time::Duration::from_millis(100),
            "gave up on the same holder again after {:?}",
            start.elapsed()
        );
        // The other GPU is free all along.
        assert!(!state.lock(1).unwrap().recovered);
        // Killed, the holder's lock is recovered as any dead holder's.
        // SAFETY: kills and reaps our own stopped child.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
            libc::waitpid(pid, std::ptr::null_mut(), 0);
        }
        assert!(state.lock(0).unwrap().recovered);
    }

    #[test]
    fn a_lock_left_unrecoverable_says_how_to_get_out() {
        let (_dir, state) = fresh_state();
        // One holder dies; the next releases the lock without repairing it.
        let died = sys::in_child(|| std::mem::forget(state.lock(0).unwrap()));
        assert_eq!(died, 0);
        let abandoned = sys::in_child(|| {
            // SAFETY: the mutex was initialised at creation and stays mapped.
            let rc = unsafe { sys::lock_and_abandon(state.gpu(0).lock.mutex.get()) };
            assert_eq!(rc, libc::EOWNERDEAD);
        });
        assert_eq!(abandoned, 0);
        let err = state.lock(0).err().expect("the lock is unrecoverable");
        assert!(
            matches!(err, StateError::Unrecoverable { gpu: 0, .. }),
            "{err:?}"
        );
        assert!(err.to_string().contains("gpusim reset --remove"), "{err}");
        // The other GPU is unaffected.
        assert!(!state.lock(1).unwrap().recovered);
    }

    #[test]
    fn the_effective_node_is_the_stored_one_once_a_state_file_exists() {
        let dir = tempfile::tempdir().unwrap();
        let state_path = dir.path().join("state");
        let given = Config {
            node_path: Some(node_file(dir.path(), "a.toml", 12040)),
            state_path: state_path.clone(),
        };
        let none = Config {
            node_path: None,
            state_path: state_path.clone(),
        };
        assert_eq!(given.effective_node().unwrap().cuda_version, 12040);
        assert_eq!(
            none.effective_node().unwrap(),
            NodeDescription::default_node()
        );
        assert!(!state_path.exists(), "nothing was created");

        State::open(&given).unwrap();
        assert_eq!(none.effective_node().unwrap().cuda_version, 12040);
        let other = Config {
            node_path: Some(node_file(dir.path(), "b.toml", 12050)),
            state_path,
        };
        assert!(matches!(
            other.effective_node(),
            Err(StateError::NodeMismatch { .. })
        ));
    }
}
