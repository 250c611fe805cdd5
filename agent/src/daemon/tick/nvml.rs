//! NVML's side of a period: the node's GPUs (loaded, and retried while
//! NVML is unavailable), their memory and processes, their SM samples.

use super::*;

/// The GPUs NVML lists (those with a UUID the region spec can hold).
fn node_gpus(backend: &NvmlBackend) -> Result<Vec<NodeGpu>, crate::gpu::GpuError> {
    let mut gpus = Vec::new();
    for index in 0..backend.device_count()? {
        let d = backend.device(index)?;
        if let Some(uuid) = tessera_region::spec::parse_uuid(&d.uuid) {
            gpus.push(NodeGpu {
                index,
                uuid,
                launch_floor: d.launch_floor(),
            });
        }
    }
    Ok(gpus)
}

impl Agent {
    pub(super) fn ensure_nvml(&mut self, status: &Status) {
        if self.nvml.gpus.is_some() {
            return;
        }
        // (message, whether to log it here: a load failure the shared
        // loader has logged already).
        let listed = match self.nvml.shared.get() {
            Err(e) => Err((with_causes(&*e), false)),
            Ok(backend) => node_gpus(&backend)
                .map(|gpus| Gpus { backend, gpus })
                .map_err(|e| (with_causes(&e), true)),
        };
        match listed {
            Ok(g) => {
                tracing::info!(gpus = g.gpus.len(), "the node's GPUs listed");
                self.nvml.gpus = Some(g);
                self.nvml.error.clear();
                status.set_nvml(Ok(()));
            }
            Err((msg, log)) => {
                if log && msg != self.nvml.error {
                    tracing::warn!(error = %msg, "NVML cannot list the node's GPUs");
                }
                self.nvml.error.clone_from(&msg);
                status.set_nvml(Err(msg));
            }
        }
    }

    /// NVML's live state of every GPU, by UUID (empty without NVML), each
    /// process's SM use taken from this period's samples `sm` (NVML's
    /// per-process utilisation is read once a period, by
    /// [`sample_sm`](Self::sample_sm)).
    pub(super) fn sample_gpus(
        &mut self,
        sm: &HashMap<[u8; 16], SmSamples>,
    ) -> HashMap<[u8; 16], GpuLive> {
        let mut out = HashMap::new();
        let Some(g) = &self.nvml.gpus else {
            return out;
        };
        for gpu in &g.gpus {
            let samples = sm.get(&gpu.uuid);
            let of = |pid: u32| {
                let v = samples?.by_pid.get(&pid)?;
                Some(v.round().clamp(0.0, 100.0) as u32)
            };
            // The memory totals only feed the device's view and gauges:
            // read again once a revisit interval.
            let known = self
                .nvml
                .device_memory
                .get(&gpu.uuid)
                .filter(|(_, at)| self.clock.periods < at + self.clock.revisit.periods())
                .map(|(m, _)| *m);
            match g.backend.live_with(gpu.index, of, known) {
                Ok(u) => {
                    if known.is_none() {
                        self.nvml.device_memory.insert(
                            gpu.uuid,
                            (
                                (u.memory_used_bytes, u.memory_free_bytes),
                                self.clock.periods,
                            ),
                        );
                    }
                    out.insert(gpu.uuid, u);
                }
                Err(e) => {
                    self.nvml.device_memory.remove(&gpu.uuid);
                    tracing::debug!(gpu = gpu.index, error = %with_causes(&e), "no usage");
                }
            }
        }
        out
    }

    /// Each GPU's SM samples since the previous period (empty without NVML).
    pub(super) fn sample_sm(&mut self) -> HashMap<[u8; 16], SmSamples> {
        let mut out = HashMap::new();
        let Some(g) = &self.nvml.gpus else {
            return out;
        };
        for gpu in &g.gpus {
            let since = *self
                .nvml
                .sm_since
                .entry(gpu.uuid)
                .or_insert_with(sampling::now_us);
            let read = g
                .backend
                .nvml()
                .device_by_index(gpu.index)
                .map_err(|source| ControlError::Nvml { source })
                .and_then(|d| sampling::read_sm_samples_into(&d, since, &mut self.nvml.sm_buf));
            match read {
                Ok(s) => {
                    self.nvml.sm_since.insert(gpu.uuid, s.newest_us);
                    out.insert(gpu.uuid, s);
                }
                Err(e) => {
                    tracing::debug!(gpu = gpu.index, error = %with_causes(&e), "no SM samples");
                }
            }
        }
        out
    }

    /// Every GPU of the node in this period's view.
    pub(super) fn devices(
        &self,
        memory: &HashMap<[u8; 16], GpuLive>,
        sm: &HashMap<[u8; 16], SmSamples>,
    ) -> Vec<DeviceView> {
        let Some(g) = &self.nvml.gpus else {
            return Vec::new();
        };
        g.gpus
            .iter()
            .map(|gpu| {
                let m = memory.get(&gpu.uuid);
                DeviceView {
                    index: gpu.index,
                    uuid: format_uuid(&gpu.uuid),
                    memory_used_bytes: m.map(|m| m.memory_used_bytes),
                    memory_total_bytes: m.map(|m| m.memory_used_bytes + m.memory_free_bytes),
                    sm_percent: sm.get(&gpu.uuid).map(SmSamples::total),
                    healthy: m.is_some(),
                }
            })
            .collect()
    }
}
