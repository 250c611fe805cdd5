//! Building the cgroup id → pod/container map from the cgroup v2 tree.
//!
//! Every directory's id is its inode number (what the eBPF programs
//! report); its path relative to the v2 root is classified by
//! [`super::path::classify`]. Paths under kubepods that match no pattern
//! are listed in [`CgroupMap::unknown`], not dropped silently.
//!
//! On a hybrid host (v2 mounted beside v1, e.g. at
//! `/sys/fs/cgroup/unified`) the systemd driver mirrors pods into v2, but
//! the cgroupfs driver does not: the pods exist only in v1, every
//! container reports its parent's v2 id, and no attribution is possible.
//! [`CgroupMap::notes`] says so when it happens.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::path::{Classified, ContainerRef, PodRef, classify};
use super::v2::cgroup_id;

/// How deep below the root the walk goes (kubepods/QoS/pod/container is 4;
/// prefixes and nested container cgroups add a few).
pub const MAX_DEPTH: usize = 12;

/// Errors walking.
#[derive(Debug, thiserror::Error)]
pub enum WalkError {
    /// The root could not be read.
    #[error("cannot read cgroup root {path}")]
    Root {
        /// The root.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// One pod or container cgroup.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CgroupEntry {
    /// Its id (inode number).
    pub id: u64,
    /// Its path relative to the v2 root, with a leading `/`.
    pub path: String,
    /// What it is: [`Classified::Pod`] or [`Classified::Container`].
    pub kind: Classified,
}

/// The pod and container cgroups of the v2 tree, by id.
#[derive(Clone, Debug, Default)]
pub struct CgroupMap {
    /// Pod and container cgroups by id.
    pub by_id: HashMap<u64, CgroupEntry>,
    /// Paths under kubepods that match no known pattern, with the reason.
    pub unknown: Vec<(String, String)>,
    /// Conditions that limit attribution (e.g. a hybrid host whose pods
    /// are only in v1).
    pub notes: Vec<String>,
}

impl CgroupMap {
    /// Walks the v2 tree at `root` (e.g. `/sys/fs/cgroup`, or
    /// `/sys/fs/cgroup/unified` on a hybrid host). Directories that vanish
    /// during the walk are skipped.
    pub fn build(root: &Path) -> Result<Self, WalkError> {
        let mut map = Self::default();
        let entries = std::fs::read_dir(root).map_err(|source| WalkError::Root {
            path: root.to_owned(),
            source,
        })?;
        let mut kubepods_seen = false;
        let mut stack: Vec<(PathBuf, usize)> = subdirs(entries).map(|d| (d, 1)).collect();
        while let Some((dir, depth)) = stack.pop() {
            let Ok(rel) = dir.strip_prefix(root) else {
                continue;
            };
            let rel = format!("/{}", rel.display());
            let kind = classify(&rel);
            match &kind {
                Classified::NotKubernetes => {}
                Classified::Unknown { reason } => {
                    kubepods_seen = true;
                    map.unknown.push((rel.clone(), reason.clone()));
                }
                Classified::QosLevel { .. } => kubepods_seen = true,
                Classified::Pod(_) | Classified::Container { .. } => {
                    kubepods_seen = true;
                    if let Ok(id) = cgroup_id(&dir) {
                        map.by_id.insert(
                            id,
                            CgroupEntry {
                                id,
                                path: rel.clone(),
                                kind: kind.clone(),
                            },
                        );
                    }
                }
            }
            if depth < MAX_DEPTH
                && let Ok(children) = std::fs::read_dir(&dir)
            {
                stack.extend(subdirs(children).map(|d| (d, depth + 1)));
            }
        }
        map.unknown.sort();
        if !kubepods_seen && let Some(note) = hybrid_note(root) {
            map.notes.push(note);
        }
        Ok(map)
    }

    /// The entry of cgroup `id`.
    pub fn get(&self, id: u64) -> Option<&CgroupEntry> {
        self.by_id.get(&id)
    }

    /// The pod of cgroup `id` (a pod or container cgroup).
    pub fn pod_of(&self, id: u64) -> Option<&PodRef> {
        self.by_id.get(&id)?.kind.pod()
    }

    /// The container of cgroup `id`.
    pub fn container_of(&self, id: u64) -> Option<&ContainerRef> {
        match &self.by_id.get(&id)?.kind {
            Classified::Container { container, .. } => Some(container),
            _ => None,
        }
    }

    /// The pod-level cgroup of pod `uid`.
    pub fn pod_cgroup(&self, uid: &str) -> Option<&CgroupEntry> {
        self.by_id
            .values()
            .find(|e| matches!(&e.kind, Classified::Pod(p) if p.uid == uid))
    }
}

/// The directories among `entries` (unreadable entries skipped).
fn subdirs(entries: std::fs::ReadDir) -> impl Iterator<Item = PathBuf> {
    entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
}

/// On a hybrid host (v2 root named `unified` inside the v1 mount), a note
/// when kubepods exists in a v1 hierarchy but not in v2.
fn hybrid_note(v2_root: &Path) -> Option<String> {
    if v2_root.file_name()? != "unified" {
        return None;
    }
    let v1_root = v2_root.parent()?;
    let v1_kubepods = std::fs::read_dir(v1_root)
        .ok()?
        .flatten()
        .map(|controller| controller.path())
        .filter(|controller| controller != v2_root)
        .find_map(|controller| {
            ["kubepods", "kubepods.slice"]
                .into_iter()
                .map(|k| controller.join(k))
                .find(|p| p.is_dir())
        })?;
    Some(format!(
        "hybrid cgroups: pods exist in cgroup v1 ({}) but not in the v2 tree ({}); \
         with the cgroupfs driver containers never join v2, so the ids the eBPF programs \
         report cannot be attributed to pods (use the systemd cgroup driver)",
        v1_kubepods.display(),
        v2_root.display()
    ))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;

    use super::*;

    const UID: &str = "7b2f3c1e-9d4a-4e5b-8c6d-0f1a2b3c4d5e";
    const UID_ESC: &str = "7b2f3c1e_9d4a_4e5b_8c6d_0f1a2b3c4d5e";
    const CID: &str = "4f6c2b0e9a8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a291807f6e5d4c3b2a19080";

    fn mkdirs(root: &Path, rel: &str) -> u64 {
        let dir = root.join(rel);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::metadata(&dir).unwrap().ino()
    }

    #[test]
    fn maps_pods_and_containers_by_inode() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        mkdirs(root, "system.slice/containerd.service");
        let pod = format!(
            "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_ESC}.slice"
        );
        let pod_id = mkdirs(root, &pod);
        let ctr_id = mkdirs(root, &format!("{pod}/cri-containerd-{CID}.scope"));
        let odd = format!("{pod}/runc-{CID}.scope");
        mkdirs(root, &odd);

        let map = CgroupMap::build(root).unwrap();
        assert_eq!(map.by_id.len(), 2, "{map:#?}");
        assert_eq!(map.pod_of(pod_id).unwrap().uid, UID);
        assert_eq!(map.pod_of(ctr_id).unwrap().uid, UID);
        assert_eq!(map.container_of(ctr_id).unwrap().id, CID);
        assert!(map.container_of(pod_id).is_none());
        assert_eq!(
            map.get(ctr_id).unwrap().path,
            format!("/{pod}/cri-containerd-{CID}.scope")
        );
        assert_eq!(map.pod_cgroup(UID).unwrap().id, pod_id);
        assert_eq!(map.unknown.len(), 1);
        assert_eq!(map.unknown[0].0, format!("/{odd}"));
        assert!(map.unknown[0].1.contains("no known runtime"));
        assert!(map.notes.is_empty());
        assert!(map.pod_of(1).is_none());
    }

    #[test]
    fn notes_hybrid_hosts_whose_pods_are_only_in_v1() {
        let tmp = tempfile::tempdir().unwrap();
        let v1 = tmp.path();
        mkdirs(v1, &format!("cpu/kubepods/burstable/pod{UID}/{CID}"));
        mkdirs(v1, "unified/system.slice");
        let map = CgroupMap::build(&v1.join("unified")).unwrap();
        assert!(map.by_id.is_empty());
        assert_eq!(map.notes.len(), 1, "{:?}", map.notes);
        assert!(map.notes[0].contains("cpu/kubepods"), "{}", map.notes[0]);

        // With the systemd driver the pods are mirrored into v2: no note.
        mkdirs(
            v1,
            &format!("unified/kubepods.slice/kubepods-pod{UID_ESC}.slice"),
        );
        let map = CgroupMap::build(&v1.join("unified")).unwrap();
        assert_eq!(map.by_id.len(), 1);
        assert!(map.notes.is_empty());
    }

    #[test]
    fn unreadable_root_is_an_error_naming_it() {
        let err = CgroupMap::build(Path::new("/nonexistent/cgroup")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "cannot read cgroup root /nonexistent/cgroup"
        );
    }
}
