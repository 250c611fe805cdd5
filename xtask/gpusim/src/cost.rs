//! How long simulated work takes.
//!
//! **Kernels.** A launch of `grid` blocks of `block` threads runs in waves:
//! each SM holds `clamp(max_threads_per_sm / threads_per_block, 1, 32)`
//! blocks at once, so one wave covers `sm_count` times that many blocks and
//!
//! ```text
//! duration = kernel_fixed_ns + ceil(blocks / blocks_per_wave) * wave_ns
//! ```
//!
//! A per-function override (`[cost.functions.<name>]`) may replace `wave_ns`
//! or fix the duration outright (`fixed_ns`), whatever the grid.
//!
//! **Copies.** `copy_fixed_ns + bytes / copy_bytes_per_us` (in µs).
//!
//! Kernels of one process run one after another in launch order (all of its
//! streams share the process's channel); contending processes time-slice
//! the GPU (see `timeline.rs`). Every kernel keeps the whole GPU busy while
//! it runs, as NVML's utilisation counts it.

use crate::node::{FunctionCost, GpuDescription, NodeDescription};

/// A launch's shape.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LaunchShape {
    /// Grid dimensions (blocks).
    pub grid: [u32; 3],
    /// Block dimensions (threads).
    pub block: [u32; 3],
}

impl LaunchShape {
    /// Total blocks (at least 1).
    pub fn blocks(&self) -> u64 {
        self.grid.iter().map(|&d| u64::from(d.max(1))).product()
    }
    /// Threads per block (at least 1).
    pub fn threads_per_block(&self) -> u64 {
        self.block.iter().map(|&d| u64::from(d.max(1))).product()
    }
    /// Warps: blocks × ceil(threads per block / 32).
    pub fn warps(&self) -> u64 {
        self.blocks()
            .saturating_mul(self.threads_per_block().div_ceil(32))
    }
}

/// The resolved cost of one named kernel on one GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelCost {
    fixed_ns: Option<u64>,
    wave_ns: u64,
    kernel_fixed_ns: u64,
    sm_count: u64,
    max_threads_per_sm: u64,
}

impl KernelCost {
    /// The cost of kernel `name` on `gpu` under `node`'s model.
    pub fn new(node: &NodeDescription, gpu: &GpuDescription, name: &str) -> Self {
        let over = node
            .cost
            .functions
            .get(name)
            .cloned()
            .unwrap_or(FunctionCost::default());
        Self {
            fixed_ns: over.fixed_ns,
            wave_ns: over.wave_ns.unwrap_or(node.cost.wave_ns),
            kernel_fixed_ns: node.cost.kernel_fixed_ns,
            sm_count: u64::from(gpu.sm_count),
            max_threads_per_sm: u64::from(gpu.max_threads_per_sm),
        }
    }

    /// Duration of one launch of `shape`, in ns (at least 1).
    pub fn duration_ns(&self, shape: &LaunchShape) -> u64 {
        if let Some(fixed) = self.fixed_ns {
            return fixed.max(1);
        }
        let per_sm = (self.max_threads_per_sm / shape.threads_per_block()).clamp(1, 32);
        let per_wave = self.sm_count * per_sm;
        let waves = shape.blocks().div_ceil(per_wave);
        self.kernel_fixed_ns
            .saturating_add(waves.saturating_mul(self.wave_ns))
            .max(1)
    }
}

/// Duration of a copy of `bytes`, in ns.
pub fn copy_ns(node: &NodeDescription, bytes: u64) -> u64 {
    let transfer = (u128::from(bytes) * 1000 / u128::from(node.cost.copy_bytes_per_us)) as u64;
    node.cost.copy_fixed_ns.saturating_add(transfer).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(g: u32, b: u32) -> LaunchShape {
        LaunchShape {
            grid: [g, 1, 1],
            block: [b, 1, 1],
        }
    }

    #[test]
    fn waves_follow_occupancy() {
        let node = NodeDescription::default_node();
        let c = KernelCost::new(&node, &node.gpu[0], "k");
        // 132 SMs x (2048/256 = 8 blocks) = 1056 blocks per wave.
        assert_eq!(c.duration_ns(&shape(1, 256)), 3_000 + 20_000);
        assert_eq!(c.duration_ns(&shape(1056, 256)), 3_000 + 20_000);
        assert_eq!(c.duration_ns(&shape(1057, 256)), 3_000 + 40_000);
        // Tiny blocks are capped at 32 resident per SM.
        assert_eq!(c.duration_ns(&shape(132 * 32 + 1, 32)), 3_000 + 40_000);
        // Zero dimensions count as one.
        assert_eq!(c.duration_ns(&LaunchShape::default()), 23_000);
    }

    #[test]
    fn overrides_replace_the_model() {
        let mut node = NodeDescription::default_node();
        node.cost.functions.insert(
            "spin".into(),
            FunctionCost {
                fixed_ns: Some(500_000),
                wave_ns: None,
            },
        );
        node.cost.functions.insert(
            "slow".into(),
            FunctionCost {
                fixed_ns: None,
                wave_ns: Some(100_000),
            },
        );
        let spin = KernelCost::new(&node, &node.gpu[0], "spin");
        assert_eq!(spin.duration_ns(&shape(1_000_000, 1024)), 500_000);
        let slow = KernelCost::new(&node, &node.gpu[0], "slow");
        assert_eq!(slow.duration_ns(&shape(1, 1)), 103_000);
    }

    #[test]
    fn copies_scale_with_bytes() {
        let node = NodeDescription::default_node();
        assert_eq!(copy_ns(&node, 0), 2_000);
        assert_eq!(copy_ns(&node, 25_000_000), 2_000 + 1_000_000);
    }
}
