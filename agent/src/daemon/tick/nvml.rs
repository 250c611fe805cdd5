//! NVML's side of a period: the node's GPUs (loaded, and retried while
//! NVML is unavailable), their memory and processes, their SM samples.

use super::*;

impl Agent {
    pub(super) fn ensure_nvml(&mut self, status: &Status) {
        if self.gpus.is_some() || Instant::now() < self.nvml_next_try {
            return;
        }
        self.nvml_next_try = Instant::now() + self.nvml_retry;
        let loaded = NvmlBackend::load(self.nvml_lib.as_os_str()).and_then(|backend| {
            let n = backend.device_count()?;
            let mut gpus = Vec::new();
            for index in 0..n {
                let d = backend.device(index)?;
                if let Some(uuid) = tessera_region::spec::parse_uuid(&d.uuid) {
                    gpus.push(NodeGpu { index, uuid });
                }
            }
            Ok(Gpus { backend, gpus })
        });
        match loaded {
            Ok(g) => {
                tracing::info!(gpus = g.gpus.len(), lib = %self.nvml_lib.display(), "NVML initialised");
                self.gpus = Some(g);
                self.nvml_error.clear();
                status.set_nvml(Ok(()));
            }
            Err(e) => {
                let msg = with_causes(&e);
                if msg != self.nvml_error {
                    tracing::warn!(error = %msg, retry_ms = self.nvml_retry.as_millis() as u64, "NVML unavailable");
                }
                self.nvml_error.clone_from(&msg);
                status.set_nvml(Err(msg));
            }
        }
    }

    /// NVML's live state of every GPU, by UUID (empty without NVML).
    pub(super) fn sample_gpus(&mut self) -> HashMap<[u8; 16], GpuUsage> {
        let mut out = HashMap::new();
        let since = self.last_sample_us;
        self.last_sample_us = unix_us();
        let Some(g) = &self.gpus else {
            return out;
        };
        for gpu in &g.gpus {
            match g.backend.usage(gpu.index, since) {
                Ok(u) => {
                    out.insert(gpu.uuid, u);
                }
                Err(e) => tracing::debug!(gpu = gpu.index, error = %with_causes(&e), "no usage"),
            }
        }
        out
    }

    /// Each GPU's SM samples since the previous period (empty without NVML).
    pub(super) fn sample_sm(&mut self) -> HashMap<[u8; 16], SmSamples> {
        let mut out = HashMap::new();
        let Some(g) = &self.gpus else {
            return out;
        };
        for gpu in &g.gpus {
            let since = *self
                .sm_since
                .entry(gpu.uuid)
                .or_insert_with(sampling::now_us);
            let read = g
                .backend
                .nvml()
                .device_by_index(gpu.index)
                .map_err(|source| ControlError::Nvml { source })
                .and_then(|d| sampling::read_sm_samples(&d, since));
            match read {
                Ok(s) => {
                    self.sm_since.insert(gpu.uuid, s.newest_us);
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
        memory: &HashMap<[u8; 16], GpuUsage>,
        sm: &HashMap<[u8; 16], SmSamples>,
    ) -> Vec<DeviceView> {
        let Some(g) = &self.gpus else {
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
