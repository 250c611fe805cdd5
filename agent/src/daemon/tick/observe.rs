//! What a period reads of each container before deciding: its usage
//! region (untrusted, I3), its processes (cgroup members joined with the
//! region's slots), and the eBPF observer's view of them.

use super::*;

/// Periods between passes over usage slots no cgroup member holds, after
/// one that freed none (a second).
const RECLAIM_EVERY: u64 = 10;

impl Agent {
    /// Host processes of `meta`'s cgroup joined with `usage`'s slots.
    pub(super) fn processes(
        &self,
        meta: &Metadata,
        usage: Option<&UsageSnapshot>,
        problems: &mut Vec<String>,
    ) -> Vec<ProcessView> {
        let slots = usage.map(|u| u.slots.as_slice()).unwrap_or_default();
        match (&meta.cgroup, &self.containers.cgroup_root) {
            (Some(rel), Some(root)) => {
                let dir = root.join(rel.trim_start_matches('/'));
                match pids::cgroup_pids(&dir) {
                    Ok(host) => {
                        let procs: Vec<_> = host
                            .iter()
                            .filter_map(|&p| self.containers.procs.borrow_mut().info(p))
                            .collect();
                        pids::join(&procs, slots)
                    }
                    Err(e) => {
                        problems.push(format!(
                            "cannot read the processes of cgroup {}: {e}",
                            dir.display()
                        ));
                        pids::join(&[], slots)
                    }
                }
            }
            (Some(rel), None) => {
                problems.push(format!(
                    "cgroup {rel} is set but no cgroup v2 hierarchy is mounted"
                ));
                pids::join(&[], slots)
            }
            (None, _) => {
                pids::join_same_namespace(|p| self.containers.procs.borrow_mut().info(p), slots)
            }
        }
    }

    /// A container's usage region and processes. The region is read from
    /// `file` (kept open between periods) into `buf` (kept between
    /// containers and periods), and only as far as
    /// this container's GPUs go ([`Scope::granted`]): the control region
    /// has no other GPU, so nothing charged beyond them can raise a limit.
    /// Slots no cgroup member holds are judged from period
    /// `reclaim_from` on; a pass that frees none moves it
    /// [`RECLAIM_EVERY`] on (a slot that stays, untagged or naming no
    /// member, costs a mapping and a cgroup read a second, not a period).
    pub(super) fn observe(
        &self,
        c: &Container,
        buf: &mut Vec<u8>,
        file: &mut UsageFile,
        reclaim_from: &mut u64,
    ) -> Observed {
        let mut problems = Vec::new();
        let scope = Scope::granted(c.meta.gpus.len());
        let read = file.read_prefix(&c.dir.join(USAGE_FILE), scope.len(), buf);
        let mut usage = read
            .map_err(|e| problems.push(format!("usage region: {}", with_causes(&e))))
            .ok()
            .and_then(|()| {
                read_usage_in(buf, scope)
                    .map_err(|e| problems.push(format!("usage region: {}", with_causes(&e))))
                    .ok()
            });
        let mut processes = self.processes(&c.meta, usage.as_ref(), &mut problems);
        if self.clock.periods >= *reclaim_from
            && processes
                .iter()
                .any(|p| p.source == pids::Source::UnmatchedSlot)
            && let Some(cgroup) = self.cgroup_dir(&c.meta)
        {
            // Slots no process of the cgroup holds: free those whose
            // owners are gone (a pid namespace of the container that has
            // no process left to free them), and read again.
            let path = c.dir.join(USAGE_FILE);
            let proc_root = self.containers.procs.borrow().proc_root().to_path_buf();
            let freed = crate::containers::reclaim::reclaim_gone(&path, &cgroup, &proc_root, |p| {
                self.containers.procs.borrow_mut().info(p)
            });
            match freed {
                Ok(0) => *reclaim_from = self.clock.periods + RECLAIM_EVERY,
                Ok(n) => {
                    tracing::info!(container = %c.id, slots = n, "freed the usage slots of processes gone from the container's cgroup");
                    usage = file
                        .read_prefix(&path, scope.len(), buf)
                        .ok()
                        .and_then(|()| read_usage_in(buf, scope).ok());
                    processes = self.processes(&c.meta, usage.as_ref(), &mut problems);
                }
                Err(e) => {
                    *reclaim_from = self.clock.periods + RECLAIM_EVERY;
                    problems.push(format!("usage region: {}", with_causes(&e)));
                }
            }
        }
        let host_pids = processes.iter().filter_map(|p| p.host_pid).collect();
        Observed {
            // The watchdog reads the header and buckets only.
            usage_raw: usage
                .is_some()
                .then(|| buf[..usage_offsets::OWNERS].to_vec()),
            usage,
            processes,
            host_pids,
            problems,
        }
    }

    /// The container's cgroup directory (absolute), if its metadata names
    /// one and a cgroup v2 hierarchy is mounted.
    pub(super) fn cgroup_dir(&self, meta: &Metadata) -> Option<PathBuf> {
        let rel = meta.cgroup.as_deref()?;
        Some(crate::watchdog::cgroup_dir(
            self.containers.cgroup_root.as_deref()?,
            rel,
        ))
    }

    /// One period of the eBPF observer over the ready containers.
    pub(super) fn observe_ebpf(
        &mut self,
        ready: &[Container],
        observed: &[Option<Observed>],
    ) -> HashMap<ContainerId, Seen> {
        let dirs: Vec<Option<PathBuf>> = ready.iter().map(|c| self.cgroup_dir(&c.meta)).collect();
        let members: Vec<Member<'_>> = ready
            .iter()
            .zip(observed)
            .zip(&dirs)
            // (A container skipped this period is quiet: no process.)
            .map(|((c, o), dir)| Member {
                id: &c.id,
                cgroup: dir.as_deref(),
                registered: o
                    .iter()
                    .flat_map(|o| &o.processes)
                    .filter(|p| {
                        p.source == pids::Source::Registered
                            || p.source == pids::Source::SameNamespace
                    })
                    .filter_map(|p| p.host_pid)
                    .collect(),
                pids: o.as_ref().map(|o| o.host_pids.clone()).unwrap_or_default(),
            })
            .collect();
        self.enforcement.ebpf.period(&members)
    }
}
