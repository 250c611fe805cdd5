//! The demo's node and containers: what each runs and the limits it gets.

use gpusim::Sim;
use tessera_region::control::{ControlSpec, GpuLimits};
use tessera_region::rate::launch_cost;

/// Memory each CUDA context costs: the simulated node charges it, and
/// every container's limit counts it.
const CONTEXT_OVERHEAD_MIB: u64 = 500;

/// The simulated node's description.
pub(super) fn node_toml() -> String {
    format!(
        r#"
driver_version = "595.45.04"

[[gpu]]
model = "NVIDIA H100 80GB HBM3"
memory_mib = 81559
sm_count = 132
numa_node = 0
nvlink_peers = [1]

[[gpu]]
model = "NVIDIA H100 80GB HBM3"
memory_mib = 81559
sm_count = 132
numa_node = 1
nvlink_peers = [0]

[cost]
context_overhead_mib = {CONTEXT_OVERHEAD_MIB}
[cost.functions.matmul]
fixed_ns = 2000000
[cost.functions.infer]
fixed_ns = 2000000
[cost.functions.batch]
fixed_ns = 1000000
"#
    )
}

pub(super) const MIB: u64 = 1 << 20;

/// What one container is and runs.
pub(super) struct Plan {
    pub(super) name: &'static str,
    /// Index of its GPU on the node (the workload's `dev`).
    pub(super) gpu: usize,
    pub(super) memory_mib: u64,
    /// Launch limit in warps/s; `None` is unlimited.
    pub(super) rate: Option<u64>,
    /// The launch limit set halfway through.
    pub(super) raise_to: Option<u64>,
    work: Work,
}

/// A container's workload.
enum Work {
    /// Allocates `alloc_mib` (if any), then launches `kernel` in
    /// `blocks` × `threads` until the end.
    Kernels {
        alloc_mib: Option<u64>,
        kernel: &'static str,
        blocks: u64,
        threads: u64,
    },
    /// Allocates `chunk_mib` chunks until one is refused (expected: out of
    /// memory at the limit), then holds them.
    UntilOom { chunk_mib: u64 },
}

impl Plan {
    /// The workload's operations (see `preload/gpusim/tests/c/workload.c`);
    /// kernels run for `ms`.
    pub(super) fn ops(&self, ms: u64) -> String {
        let dev = self.gpu;
        match self.work {
            Work::Kernels {
                alloc_mib,
                kernel,
                blocks,
                threads,
            } => {
                let alloc = alloc_mib.map_or(String::new(), |mib| format!(" alloc {mib}"));
                format!("dev {dev}{alloc} ready run {kernel} {blocks} {threads} {ms}")
            }
            Work::UntilOom { chunk_mib } => {
                format!("dev {dev} ready alloc-until-oom {chunk_mib} meminfo hold")
            }
        }
    }

    /// Warps each launch costs against the launch limit.
    pub(super) fn warps_per_launch(&self) -> Option<u64> {
        match self.work {
            Work::Kernels {
                blocks, threads, ..
            } => Some(launch_cost(blocks, threads)),
            Work::UntilOom { .. } => None,
        }
    }

    pub(super) fn expects_oom(&self) -> bool {
        matches!(self.work, Work::UntilOom { .. })
    }
}

/// The four containers of the table on top.
pub(super) fn plans() -> [Plan; 4] {
    [
        Plan {
            name: "train-a",
            gpu: 0,
            memory_mib: 20_000,
            rate: None,
            raise_to: None,
            work: Work::Kernels {
                alloc_mib: Some(16_000),
                kernel: "matmul",
                blocks: 528,
                threads: 256,
            },
        },
        Plan {
            name: "serve-b",
            gpu: 0,
            memory_mib: 8_000,
            rate: Some(4_000),
            raise_to: None,
            work: Work::Kernels {
                alloc_mib: Some(6_000),
                kernel: "infer",
                blocks: 16,
                threads: 128,
            },
        },
        Plan {
            name: "greedy-c",
            gpu: 1,
            memory_mib: 4_000,
            rate: None,
            raise_to: None,
            work: Work::UntilOom { chunk_mib: 500 },
        },
        Plan {
            name: "batch-d",
            gpu: 1,
            memory_mib: 8_000,
            rate: Some(2_000),
            raise_to: Some(8_000),
            work: Work::Kernels {
                alloc_mib: None,
                kernel: "batch",
                blocks: 8,
                threads: 128,
            },
        },
    ]
}

pub(super) fn control_spec(sim: &Sim, plan: &Plan, rate: Option<u64>) -> ControlSpec {
    ControlSpec {
        flags: 0,
        gpus: vec![limits(sim.uuid_bytes(plan.gpu), plan.memory_mib, rate)],
    }
}

fn limits(uuid: [u8; 16], memory_mib: u64, rate: Option<u64>) -> GpuLimits {
    GpuLimits {
        memory_limit: memory_mib * MIB,
        context_overhead: CONTEXT_OVERHEAD_MIB * MIB,
        launch_rate: rate.unwrap_or(tessera_region::UNLIMITED),
        launch_burst: rate.map_or(0, |r| (r / 100).max(1)),
        uuid,
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn plans_give_the_workloads_and_launch_costs_of_the_table() {
        let plans = plans();
        let ops: Vec<String> = plans.iter().map(|p| p.ops(16_000)).collect();
        assert_eq!(
            ops,
            [
                "dev 0 alloc 16000 ready run matmul 528 256 16000",
                "dev 0 alloc 6000 ready run infer 16 128 16000",
                "dev 1 ready alloc-until-oom 500 meminfo hold",
                "dev 1 ready run batch 8 128 16000",
            ]
        );
        let warps: Vec<Option<u64>> = plans.iter().map(Plan::warps_per_launch).collect();
        assert_eq!(warps, [Some(528 * 8), Some(64), None, Some(32)]);
        let oom: Vec<&str> = plans
            .iter()
            .filter(|p| p.expects_oom())
            .map(|p| p.name)
            .collect();
        assert_eq!(oom, ["greedy-c"]);
    }

    #[test]
    fn the_node_charges_the_overhead_the_limits_count() {
        let node = gpusim::NodeDescription::parse(&node_toml(), Path::new("demo")).unwrap();
        assert_eq!(node.cost.context_overhead_mib, CONTEXT_OVERHEAD_MIB);
        assert_eq!(
            limits([0; 16], 1, None).context_overhead,
            CONTEXT_OVERHEAD_MIB * MIB
        );
    }
}
