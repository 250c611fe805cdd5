//! The root of region directories: create, update, remove and list
//! containers atomically.
//!
//! Layout under the root (default `/var/lib/tessera/containers`):
//!
//! ```text
//! <root>/.lock           flock(2)ed by every writer of a control region
//! <root>/<id>/control    limits (tessera-region), written by the agent only
//! <root>/<id>/usage      usage (tessera-region), written by the container
//! <root>/<id>/meta.json  metadata (super::meta)
//! <root>/.new.<id>.<pid> a directory being created (renamed into place)
//! <root>/.rm.<id>.<pid>  a directory being removed
//! ```
//!
//! Invariants:
//! - a container directory appears complete (control, usage, metadata)
//!   or not at all: it is built under a dot-name and renamed into place;
//!   it disappears at once the same way;
//! - the metadata is replaced by temp + rename, never rewritten in place;
//! - the control region has one writer at a time: every writer (the
//!   `container` CLI, the daemon) holds `<root>/.lock`, a kernel lock in a
//!   directory containers never see (only `<root>/<id>` is mounted into a
//!   container), so no container can hold it and a dead holder releases it;
//! - a malformed or foreign entry is listed in [`Listing::skipped`] with
//!   the reason, never an error of the whole listing.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use rustix::fs::{FlockOperation, flock};
use tessera_error_chain::PathIoError;
use tessera_region::RegionError;
use tessera_region::file::{CONTROL_FILE, create_control, create_usage, open_control_rw};

use super::id::{ContainerId, IdError};
use super::meta::{META_FILE, MetaError, Metadata};

/// Largest metadata file read (bytes).
pub const MAX_META_LEN: u64 = 64 << 10;
/// The lock file's name under the root.
pub const LOCK_FILE: &str = ".lock";

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The id is not acceptable.
    #[error(transparent)]
    Id(#[from] IdError),
    /// The metadata is malformed.
    #[error("metadata {path}")]
    Meta {
        /// The metadata file.
        path: PathBuf,
        /// What is wrong.
        #[source]
        source: MetaError,
    },
    /// A file system call failed: `cannot {action} {path}`.
    #[error(transparent)]
    Io(#[from] PathIoError),
    /// A region file could not be written or read.
    #[error("region directory {dir}")]
    Region {
        /// The directory.
        dir: PathBuf,
        /// Cause.
        #[source]
        source: RegionError,
    },
    /// `add` of an id that exists.
    #[error("container {id} already exists ({dir}); use `container set` to change it")]
    Exists {
        /// The id.
        id: ContainerId,
        /// Its directory.
        dir: PathBuf,
    },
    /// No container with this id.
    #[error("there is no container {id} under {root}")]
    Missing {
        /// The id.
        id: ContainerId,
        /// The root.
        root: PathBuf,
    },
    /// The entry is not a plain directory.
    #[error("{path} is not a directory (a {kind})")]
    NotDir {
        /// The entry.
        path: PathBuf,
        /// What it is.
        kind: &'static str,
    },
    /// The metadata file is not a regular file (a FIFO, device, directory).
    #[error("{path} is not a regular file")]
    NotRegular {
        /// The file.
        path: PathBuf,
    },
    /// A change was refused.
    #[error("container {id}: {problem}")]
    Refused {
        /// The id.
        id: ContainerId,
        /// What is wrong.
        problem: String,
    },
}

fn io<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> StoreError + 'a {
    move |source| PathIoError::new(action, path, source).into()
}

/// Identity of a metadata file version (replaced by rename: a new inode).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileKey {
    /// Inode.
    pub ino: u64,
    /// Modification time (ns since the epoch).
    pub mtime_ns: i128,
    /// Size.
    pub len: u64,
}

/// One container found under the root.
#[derive(Debug, Clone)]
pub struct Container {
    /// Its id.
    pub id: ContainerId,
    /// Its region directory.
    pub dir: PathBuf,
    /// Its metadata (shared with the cache and the period's view: a period
    /// copies no metadata).
    pub meta: std::sync::Arc<Metadata>,
    /// The metadata file version read.
    pub meta_key: FileKey,
}

/// An entry of the root that is not a usable container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    /// The entry's name (lossy).
    pub name: String,
    /// Why it was skipped.
    pub reason: String,
}

/// What [`Store::list`] found.
#[derive(Debug, Default)]
pub struct Listing {
    /// Usable containers, by id.
    pub containers: Vec<Container>,
    /// Malformed or foreign entries.
    pub skipped: Vec<Skipped>,
}

/// The exclusive writer lock of a root; released on drop (or death).
#[derive(Debug)]
pub struct WriterLock {
    _file: File,
}

/// Parsed metadata by file identity (inode, modification time, length),
/// so that a daemon period reads and parses only the `meta.json` files
/// that changed since the previous one and `lstat`s the rest. Every writer
/// replaces the file by rename (a new inode), so an unchanged identity is
/// unchanged content.
///
/// It also keeps the root's entries, read again only when the root
/// directory itself changed (see [`RootKey`]).
#[derive(Debug, Default)]
pub struct MetaCache {
    /// By path: identity, parsed metadata, and the listing that last used
    /// it (entries the last fresh listing of the root did not use are
    /// forgotten after it; between fresh listings the root's entries are
    /// the same, so no file goes stale).
    entries: std::collections::HashMap<PathBuf, (FileKey, std::sync::Arc<Metadata>, u64)>,
    /// Listings so far.
    listing: u64,
    /// The root's entries as last read (parsed), and the root's identity
    /// then.
    root: Option<(RootKey, std::sync::Arc<[Parsed]>)>,
}

/// The identity of the root directory: creating, removing or renaming an
/// entry changes its modification and change times, and a subdirectory
/// made or removed its link count. The times come from a coarse clock, so
/// a change in the same tick as the last read can keep them: a root
/// changed less than [`ROOT_SETTLE_NS`] before it was read is read again
/// (and the daemon forces a read now and then regardless).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct RootKey {
    dev: u64,
    ino: u64,
    mtime_ns: i128,
    ctime_ns: i128,
    nlink: u64,
    /// Whether the root had changed less than [`ROOT_SETTLE_NS`] before
    /// it was read (such a key never matches).
    settling: bool,
}

/// An entry of the root: its name, and its type if the listing said.
type Entry = (std::ffi::OsString, Option<std::fs::FileType>);

/// An entry of the root, its name checked: a container id (with the
/// entry's type if the listing said), or why it is not one. The store's
/// own (dot-prefixed) entries are left out.
#[derive(Debug, Clone, PartialEq)]
enum Parsed {
    Container(ContainerId, Option<std::fs::FileType>),
    Skipped(Skipped),
}

/// Checks the names of the root's entries.
fn parse_entries(names: Vec<Entry>) -> Vec<Parsed> {
    let mut out = Vec::with_capacity(names.len());
    for (os, file_type) in names {
        let Some(text) = os.to_str() else {
            out.push(Parsed::Skipped(Skipped {
                name: os.to_string_lossy().into_owned(),
                reason: "name is not UTF-8".into(),
            }));
            continue;
        };
        if text.starts_with('.') {
            continue; // the store's own entries
        }
        out.push(match ContainerId::new(text) {
            Ok(id) => Parsed::Container(id, file_type),
            Err(e) => Parsed::Skipped(Skipped {
                name: text.to_owned(),
                reason: e.to_string(),
            }),
        });
    }
    out
}

/// How long after its last change the root is read on every listing.
const ROOT_SETTLE_NS: i128 = 1_000_000_000;

fn root_key(m: &std::fs::Metadata) -> RootKey {
    let mtime_ns = i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec());
    let ctime_ns = i128::from(m.ctime()) * 1_000_000_000 + i128::from(m.ctime_nsec());
    let now_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i128);
    RootKey {
        dev: m.dev(),
        ino: m.ino(),
        mtime_ns,
        ctime_ns,
        nlink: m.nlink(),
        settling: now_ns - mtime_ns.max(ctime_ns) < ROOT_SETTLE_NS,
    }
}

impl MetaCache {
    /// `path`'s metadata: the cached copy while the file's identity is the
    /// one it was read with, else read afresh (and cached if valid).
    fn read(&mut self, path: &Path) -> Result<(std::sync::Arc<Metadata>, FileKey), StoreError> {
        let listing = self.listing;
        if let Ok(m) = std::fs::symlink_metadata(path)
            && m.is_file()
            && let Some((key, meta, used)) = self.entries.get_mut(path)
            && *key == key_of(&m)
        {
            *used = listing;
            return Ok((meta.clone(), *key));
        }
        match read_meta(path) {
            Ok((meta, key)) => {
                let meta = std::sync::Arc::new(meta);
                self.entries
                    .insert(path.to_path_buf(), (key, meta.clone(), listing));
                Ok((meta, key))
            }
            Err(e) => {
                self.entries.remove(path);
                Err(e)
            }
        }
    }

    /// Starts a listing: entries it does not read are forgotten by
    /// [`Self::end_listing`].
    fn start_listing(&mut self) {
        self.listing += 1;
    }

    /// Forgets the files the listing just done did not read (their
    /// containers are gone or unusable).
    fn end_listing(&mut self) {
        let listing = self.listing;
        self.entries.retain(|_, (_, _, used)| *used == listing);
    }
}

/// The region directories under one root.
#[derive(Debug, Clone)]
pub struct Store {
    root: PathBuf,
}

fn key_of(m: &std::fs::Metadata) -> FileKey {
    FileKey {
        ino: m.ino(),
        mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
        len: m.len(),
    }
}

/// Reads a metadata file without following a symlink, blocking on a FIFO
/// or reading more than [`MAX_META_LEN`].
pub fn read_meta(path: &Path) -> Result<(Metadata, FileKey), StoreError> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(io("open", path))?;
    let m = file.metadata().map_err(io("stat", path))?;
    if !m.is_file() {
        return Err(StoreError::NotRegular {
            path: path.to_path_buf(),
        });
    }
    let mut bytes = Vec::new();
    file.take(MAX_META_LEN + 1)
        .read_to_end(&mut bytes)
        .map_err(io("read", path))?;
    if bytes.len() as u64 > MAX_META_LEN {
        return Err(StoreError::Meta {
            path: path.to_path_buf(),
            source: MetaError {
                field: "(file)".into(),
                problem: format!("is over {MAX_META_LEN} bytes"),
            },
        });
    }
    let meta = Metadata::from_json(&bytes).map_err(|source| StoreError::Meta {
        path: path.to_path_buf(),
        source,
    })?;
    Ok((meta, key_of(&m)))
}

/// The key of the metadata file now (to tell whether it changed).
pub fn meta_key(dir: &Path) -> Option<FileKey> {
    std::fs::symlink_metadata(dir.join(META_FILE))
        .ok()
        .map(|m| key_of(&m))
}

/// Writes `meta` to `dir/meta.json` by temp + rename.
fn write_meta(dir: &Path, meta: &Metadata) -> Result<(), StoreError> {
    let tmp = dir.join(format!(".{META_FILE}.tmp.{}", std::process::id()));
    let path = dir.join(META_FILE);
    let _ = std::fs::remove_file(&tmp);
    let text = serde_json::to_vec_pretty(meta)
        .map_err(|e| io("encode", &path)(std::io::Error::other(e)))?;
    let written = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)
            .map_err(io("create", &tmp))?;
        f.write_all(&text).map_err(io("write", &tmp))?;
        f.write_all(b"\n").map_err(io("write", &tmp))?;
        f.sync_all().map_err(io("flush", &tmp))?;
        std::fs::rename(&tmp, &path).map_err(io("publish", &path))
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

fn sync_dir(dir: &Path) {
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
}

impl Store {
    /// The store at `root` (not touched yet).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// The root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `root/<id>`.
    pub fn dir(&self, id: &ContainerId) -> PathBuf {
        self.root.join(id.as_str())
    }

    /// Creates the root (mode 0755) if it does not exist.
    pub fn ensure_root(&self) -> Result<(), StoreError> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(&self.root)
            .map_err(io("create", &self.root))
    }

    fn lock_file(&self) -> Result<File, StoreError> {
        let path = self.root.join(LOCK_FILE);
        let open = || {
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&path)
        };
        match open() {
            // The root is created only when it is missing (not once a period).
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                self.ensure_root()?;
                open()
            }
            other => other,
        }
        .map_err(io("open", &path))
    }

    /// Takes the writer lock, waiting for another writer.
    pub fn lock(&self) -> Result<WriterLock, StoreError> {
        let file = self.lock_file()?;
        let path = self.root.join(LOCK_FILE);
        flock(&file, FlockOperation::LockExclusive).map_err(|e| io("lock", &path)(e.into()))?;
        Ok(WriterLock { _file: file })
    }

    /// Takes the writer lock if it is free now.
    pub fn try_lock(&self) -> Result<Option<WriterLock>, StoreError> {
        let file = self.lock_file()?;
        match flock(&file, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => Ok(Some(WriterLock { _file: file })),
            Err(rustix::io::Errno::WOULDBLOCK) => Ok(None),
            Err(e) => Err(io("lock", &self.root.join(LOCK_FILE))(e.into())),
        }
    }

    /// Creates container `id` with `meta` (control with the memory limits
    /// and no launch limit until the daemon sets one, empty usage, the
    /// metadata), atomically.
    pub fn add(&self, id: &ContainerId, meta: &Metadata) -> Result<Container, StoreError> {
        meta.validate().map_err(|source| StoreError::Meta {
            path: self.dir(id).join(META_FILE),
            source,
        })?;
        let _lock = self.lock()?;
        let dir = self.dir(id);
        if std::fs::symlink_metadata(&dir).is_ok() {
            return Err(StoreError::Exists {
                id: id.clone(),
                dir,
            });
        }
        let tmp = self.root.join(format!(".new.{id}.{}", std::process::id()));
        if std::fs::symlink_metadata(&tmp).is_ok() {
            std::fs::remove_dir_all(&tmp).map_err(io("remove", &tmp))?;
        }
        let built = (|| -> Result<(), StoreError> {
            std::fs::DirBuilder::new()
                .mode(0o755)
                .create(&tmp)
                .map_err(io("create", &tmp))?;
            let region = |source| StoreError::Region {
                dir: dir.clone(),
                source,
            };
            // Paced from the start (not unlimited until the agent's first
            // period): the controller's own starting rate.
            let start = crate::control::ControllerConfig::default().initial_limits();
            create_control(&tmp, &meta.control_spec(|_| start)).map_err(region)?;
            create_usage(&tmp).map_err(region)?;
            write_meta(&tmp, meta)?;
            sync_dir(&tmp);
            std::fs::rename(&tmp, &dir).map_err(io("publish", &dir))?;
            sync_dir(&self.root);
            Ok(())
        })();
        if built.is_err() {
            let _ = std::fs::remove_dir_all(&tmp);
        }
        built?;
        self.load(id)
    }

    /// Container `id` as it is on disk.
    pub fn load(&self, id: &ContainerId) -> Result<Container, StoreError> {
        self.load_with(id, None, None)
    }

    fn load_with(
        &self,
        id: &ContainerId,
        cache: Option<&mut MetaCache>,
        listed: Option<std::fs::FileType>,
    ) -> Result<Container, StoreError> {
        let dir = self.dir(id);
        // A listing already knows the entry's type (from the directory
        // entry, no stat): one path walk less per container per period.
        let kind = match listed {
            Some(t) => Ok(t),
            None => std::fs::symlink_metadata(&dir).map(|m| m.file_type()),
        };
        match kind {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(StoreError::Missing {
                    id: id.clone(),
                    root: self.root.clone(),
                });
            }
            Err(e) => return Err(io("stat", &dir)(e)),
            Ok(t) if t.is_symlink() => {
                return Err(StoreError::NotDir {
                    path: dir,
                    kind: "symbolic link",
                });
            }
            Ok(t) if !t.is_dir() => {
                return Err(StoreError::NotDir {
                    path: dir,
                    kind: "file",
                });
            }
            Ok(_) => {}
        }
        let path = dir.join(META_FILE);
        let (meta, meta_key) = match cache {
            Some(c) => c.read(&path)?,
            None => {
                let (meta, key) = read_meta(&path)?;
                (std::sync::Arc::new(meta), key)
            }
        };
        Ok(Container {
            id: id.clone(),
            dir,
            meta,
            meta_key,
        })
    }

    /// Changes container `id`'s metadata with `edit` and publishes the new
    /// memory limits to its control region at once (running processes see
    /// them; launch rates are kept, the daemon sets them from the new
    /// target within one period).
    pub fn set(
        &self,
        id: &ContainerId,
        edit: impl FnOnce(&mut Metadata) -> Result<(), String>,
    ) -> Result<Container, StoreError> {
        let lock = self.lock()?;
        let c = self.load(id)?;
        let mut meta = Metadata::clone(&c.meta);
        edit(&mut meta).map_err(|problem| StoreError::Refused {
            id: id.clone(),
            problem,
        })?;
        meta.validate().map_err(|source| StoreError::Meta {
            path: c.dir.join(META_FILE),
            source,
        })?;
        write_meta(&c.dir, &meta)?;
        publish(&c.dir, &meta, &lock)?;
        self.touch_root();
        self.load(id)
    }

    /// Moves the root's modification time to now, so that a running daemon
    /// looks at every container in its next period ([`Self::list_cached`]
    /// keeps quiet ones untouched while the root is unchanged). Best
    /// effort: without it the change is seen at the container's next
    /// visit all the same.
    fn touch_root(&self) {
        let touched =
            File::open(&self.root).and_then(|d| d.set_modified(std::time::SystemTime::now()));
        if let Err(e) = touched {
            tracing::debug!(root = %self.root.display(), error = %e, "cannot touch the root");
        }
    }

    /// Removes container `id`: its directory disappears at once. Running
    /// processes keep the limits they have mapped.
    pub fn remove(&self, id: &ContainerId) -> Result<(), StoreError> {
        let _lock = self.lock()?;
        let dir = self.dir(id);
        self.load(id).map(drop).or_else(|e| match e {
            // A malformed directory can still be removed.
            StoreError::Meta { .. } | StoreError::Io(_) if dir.is_dir() => Ok(()),
            e => Err(e),
        })?;
        let gone = self.root.join(format!(".rm.{id}.{}", std::process::id()));
        std::fs::rename(&dir, &gone).map_err(io("remove", &dir))?;
        sync_dir(&self.root);
        std::fs::remove_dir_all(&gone).map_err(io("remove", &gone))
    }

    /// Every container under the root; unusable entries are skipped with
    /// the reason. A missing root is an empty listing.
    pub fn list(&self) -> Result<Listing, StoreError> {
        self.list_with(None)
    }

    /// [`Self::list`], parsing only the metadata files that changed since
    /// `cache` saw them, and reading the root's entries again only when
    /// the root changed or `force` is set (the daemon's period). A
    /// container for which `keep` returns its last [`Container`] is taken
    /// as it is, without a look at its directory (the daemon keeps quiet
    /// containers between their visits), unless the root changed (its
    /// identity, or the entries `force` read again); one that is no longer
    /// an entry of the root is gone all the same.
    pub fn list_cached(
        &self,
        cache: &mut MetaCache,
        force: bool,
        keep: impl Fn(&ContainerId) -> Option<Container>,
    ) -> Result<Listing, StoreError> {
        // (entries, whether they were read afresh)
        let (parsed, fresh) = match std::fs::metadata(&self.root) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                cache.root = None;
                (std::sync::Arc::from(Vec::new()), true)
            }
            Err(e) => return Err(io("stat", &self.root)(e)),
            Ok(m) => {
                let key = root_key(&m);
                match &cache.root {
                    Some((k, parsed)) if !force && *k == key && !k.settling => {
                        (parsed.clone(), false)
                    }
                    cached => {
                        let now = parse_entries(self.entries()?);
                        // Forced on a root whose identity did not change:
                        // the same entries are the same containers.
                        let same = cached
                            .as_ref()
                            .filter(|(k, parsed)| *k == key && !k.settling && **parsed == *now);
                        match same {
                            Some((_, parsed)) => (parsed.clone(), false),
                            None => {
                                let parsed: std::sync::Arc<[Parsed]> = now.into();
                                cache.root = Some((key, parsed.clone()));
                                (parsed, true)
                            }
                        }
                    }
                }
            }
        };
        if !fresh {
            // The same entries as at the last fresh read: every cached
            // file still belongs to one (nothing to forget); a container
            // is kept as it is or looked at.
            return Ok(self.list_parsed(&parsed, Some(cache), keep));
        }
        // A root that changed may hold a new directory under an old name:
        // then every container is looked at, and the files of entries gone
        // are forgotten.
        cache.start_listing();
        let out = self.list_parsed(&parsed, Some(&mut *cache), |_| None);
        cache.end_listing();
        Ok(out)
    }

    /// The root's entries (none when it is missing).
    fn entries(&self) -> Result<Vec<Entry>, StoreError> {
        let entries = match std::fs::read_dir(&self.root) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io("list", &self.root)(e)),
        };
        let mut out = Vec::new();
        for entry in entries {
            let entry = entry.map_err(io("list", &self.root))?;
            out.push((entry.file_name(), entry.file_type().ok()));
        }
        Ok(out)
    }

    fn list_with(&self, cache: Option<&mut MetaCache>) -> Result<Listing, StoreError> {
        let parsed = parse_entries(self.entries()?);
        Ok(self.list_parsed(&parsed, cache, |_| None))
    }

    fn list_parsed(
        &self,
        parsed: &[Parsed],
        mut cache: Option<&mut MetaCache>,
        keep: impl Fn(&ContainerId) -> Option<Container>,
    ) -> Listing {
        let mut out = Listing::default();
        for p in parsed {
            let (id, file_type) = match p {
                Parsed::Skipped(s) => {
                    out.skipped.push(s.clone());
                    continue;
                }
                Parsed::Container(id, t) => (id, *t),
            };
            if let Some(c) = keep(id) {
                out.containers.push(c);
                continue;
            }
            match self.load_with(id, cache.as_deref_mut(), file_type) {
                Ok(c) => out.containers.push(c),
                Err(e) => out.skipped.push(Skipped {
                    name: id.to_string(),
                    reason: crate::error_chain::with_causes(&e),
                }),
            }
        }
        out.containers.sort_by(|a, b| a.id.cmp(&b.id));
        out.skipped.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }
}

/// Writes `meta`'s limits to `dir/control`, keeping each GPU's current
/// launch rate and burst (held `lock` proves the caller is the one writer).
pub fn publish(dir: &Path, meta: &Metadata, _lock: &WriterLock) -> Result<(), StoreError> {
    let region = |source| StoreError::Region {
        dir: dir.to_path_buf(),
        source,
    };
    let control = open_control_rw(dir).map_err(region)?;
    let current = control.snapshot();
    let spec = meta.control_spec(|uuid| {
        current.gpus.iter().find(|g| &g.uuid == uuid).map_or(
            crate::control::ControllerConfig::default().initial_limits(),
            crate::control::Pacing::from,
        )
    });
    control.write(&spec).map_err(region)
}

/// `dir/control` exists as a regular file (not a link).
pub fn has_control(dir: &Path) -> bool {
    std::fs::symlink_metadata(dir.join(CONTROL_FILE)).is_ok_and(|m| m.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::containers::meta::{GpuGrant, META_VERSION};

    fn meta(target: u32) -> Metadata {
        Metadata {
            version: META_VERSION,
            namespace: None,
            pod: None,
            container: None,
            claim: None,
            pod_uid: None,
            cgroup: None,
            sm_target: target,
            mode: None,
            priority: None,
            labels: Default::default(),
            fail_open: false,
            gpus: vec![GpuGrant {
                uuid: "GPU-5e1a0000-0000-4000-8000-000051510000".into(),
                memory_limit_bytes: Some(1 << 30),
                context_overhead_bytes: 0,
            }],
        }
    }

    fn targets(store: &Store, cache: &mut MetaCache) -> Vec<(String, u32)> {
        let l = store.list_cached(cache, false, |_| None).unwrap();
        l.containers
            .iter()
            .map(|c| (c.id.to_string(), c.meta.sm_target))
            .collect()
    }

    /// The cache never serves metadata that changed on disk (replaced,
    /// rewritten in place, or of a container removed and made again), and
    /// forgets the containers a listing no longer finds.
    #[test]
    fn the_metadata_cache_follows_the_files_and_forgets_gone_containers() {
        let root = tempfile::tempdir().unwrap();
        let store = Store::new(root.path());
        let mut cache = MetaCache::default();
        let (a, b) = (
            ContainerId::new("a").unwrap(),
            ContainerId::new("b").unwrap(),
        );
        store.add(&a, &meta(10)).unwrap();
        store.add(&b, &meta(20)).unwrap();
        assert_eq!(
            targets(&store, &mut cache),
            [("a".into(), 10), ("b".into(), 20)]
        );
        assert_eq!(cache.entries.len(), 2);
        // Replaced through the store (a rename).
        store
            .set(&a, |m| {
                m.sm_target = 11;
                Ok(())
            })
            .unwrap();
        // Rewritten in place (same inode, another length).
        let path = store.dir(&b).join(META_FILE);
        let mut m = meta(20);
        m.pod = Some("rewritten".into());
        std::fs::write(&path, serde_json::to_vec(&m).unwrap()).unwrap();
        let l = store.list_cached(&mut cache, false, |_| None).unwrap();
        assert_eq!(l.containers[0].meta.sm_target, 11);
        assert_eq!(l.containers[1].meta.pod.as_deref(), Some("rewritten"));
        // Gone: forgotten by the next listing; made again: read afresh.
        store.remove(&b).unwrap();
        assert_eq!(targets(&store, &mut cache), [("a".into(), 11)]);
        assert_eq!(cache.entries.len(), 1, "b's entry is forgotten");
        store.add(&b, &meta(30)).unwrap();
        assert_eq!(
            targets(&store, &mut cache),
            [("a".into(), 11), ("b".into(), 30)]
        );
        assert_eq!(cache.entries.len(), 2);
    }

    /// A forced listing of a root whose entries did not change still takes
    /// kept containers as they are; one whose entries changed looks at
    /// every container. (The kept copy is told apart by its target.)
    #[test]
    fn a_forced_listing_keeps_containers_unless_the_entries_changed() {
        let root = tempfile::tempdir().unwrap();
        let store = Store::new(root.path());
        let mut cache = MetaCache::default();
        let a = ContainerId::new("a").unwrap();
        store.add(&a, &meta(10)).unwrap();
        let first = store.list_cached(&mut cache, false, |_| None).unwrap();
        let kept = Container {
            meta: std::sync::Arc::new(meta(99)),
            ..first.containers[0].clone()
        };
        let keep = |id: &ContainerId| (*id == a).then(|| kept.clone());
        // Past the settling time of the root's last change.
        std::thread::sleep(std::time::Duration::from_nanos(ROOT_SETTLE_NS as u64));
        let l = store.list_cached(&mut cache, false, |_| None).unwrap();
        assert_eq!(l.containers[0].meta.sm_target, 10);
        for force in [false, true] {
            let l = store.list_cached(&mut cache, force, keep).unwrap();
            assert_eq!(l.containers[0].meta.sm_target, 99, "force {force}");
        }
        store
            .add(&ContainerId::new("b").unwrap(), &meta(20))
            .unwrap();
        let l = store.list_cached(&mut cache, true, keep).unwrap();
        let got: Vec<_> = l.containers.iter().map(|c| c.meta.sm_target).collect();
        assert_eq!(got, [10, 20], "a new entry: every container looked at");
    }
}
