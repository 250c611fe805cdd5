//! The demo's node and containers: what each runs and the limits it gets.

/// Memory each CUDA context costs: the simulated node charges it, and
/// every container's limit counts it (`overhead=` of its `--gpu`).
pub(super) const CONTEXT_OVERHEAD_MIB: u64 = 500;
/// GPUs of the simulated node.
pub(super) const GPUS: usize = 4;

pub(super) const MIB: u64 = 1 << 20;

/// The simulated node's description: four H100s; `spin` kernels of 1 ms
/// (a saturating workload launches them back to back).
pub(super) fn node_toml() -> String {
    let mut t = String::from("driver_version = \"595.45.04\"\n");
    for i in 0..GPUS {
        t.push_str(&format!(
            "\n[[gpu]]\nmodel = \"NVIDIA H100 80GB HBM3\"\nmemory_mib = 81559\nsm_count = 132\nnuma_node = {}\n",
            i / 2
        ));
    }
    t.push_str(&format!(
        "\n[cost]\ncontext_overhead_mib = {CONTEXT_OVERHEAD_MIB}\n[cost.functions.spin]\nfixed_ns = 1000000\n"
    ));
    t
}

/// Whether `node` has the demo's GPUs and costs ([`node_toml`]; its
/// stand-in devices may differ).
pub(super) fn same_node(node: &gpusim::NodeDescription) -> bool {
    let demo = gpusim::NodeDescription::parse(&node_toml(), std::path::Path::new("demo"))
        .expect("the demo's node description parses");
    node.gpu == demo.gpu && node.cost == demo.cost && node.scheduler == demo.scheduler
}

/// How a container holds its SM target (`--mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Mode {
    Hard,
    Elastic,
}

impl Mode {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Mode::Hard => "hard",
            Mode::Elastic => "elastic",
        }
    }
}

/// What one container is and runs.
#[derive(Clone, Debug)]
pub(super) struct Plan {
    pub(super) name: &'static str,
    /// Index of its GPU on the node (the workload's `dev`).
    pub(super) gpu: usize,
    pub(super) mode: Mode,
    /// SM target (percent of the GPU).
    pub(super) sm_target: u32,
    /// The SM target set live (`container set`) halfway through.
    pub(super) change_to: Option<u32>,
    pub(super) memory_mib: u64,
    pub(super) work: Work,
}

/// A container's workload (an unmodified CUDA program: the simulator's C
/// workload, `xtask/gpusim/tests/c/workload.c`).
#[derive(Clone, Copy, Debug)]
pub(super) enum Work {
    /// Allocates `alloc_mib`, then launches 8-warp `spin` kernels back to
    /// back until the end.
    Saturate { alloc_mib: u64 },
    /// Allocates `chunk_mib` chunks until one is refused (expected: out of
    /// memory at the limit), keeps them, then saturates like the others.
    UntilOom { chunk_mib: u64 },
}

impl Plan {
    /// The workload's operations on its GPU, device `dev` of those it
    /// sees (its node index on the plain demo's node; 0 in a pod, which
    /// sees only its own GPU); kernels run for `ms`.
    pub(super) fn ops(&self, dev: usize, ms: u64) -> String {
        match self.work {
            Work::Saturate { alloc_mib } => {
                format!("dev {dev} alloc {alloc_mib} ready run spin 1 256 {ms}")
            }
            Work::UntilOom { chunk_mib } => {
                format!("dev {dev} ready alloc-until-oom {chunk_mib} meminfo run spin 1 256 {ms}")
            }
        }
    }

    pub(super) fn expects_oom(&self) -> bool {
        matches!(self.work, Work::UntilOom { .. })
    }

    /// Its `nvidia.com/gpumem` in a pod: what it may allocate. A pod's
    /// grant charges no context overhead (its CUDA context is on top of
    /// the limit), so the pod asks for its memory limit less the context,
    /// and holds at most `memory_mib` as the plain demo's container does.
    pub(super) fn pod_gpumem_mib(&self) -> u64 {
        self.memory_mib - CONTEXT_OVERHEAD_MIB
    }

    /// Its `--gpu` spec for `tessera-agent container add`.
    pub(super) fn gpu_spec(&self, uuid: &str) -> String {
        format!(
            "{uuid},memory={},overhead={CONTEXT_OVERHEAD_MIB}",
            self.memory_mib
        )
    }
}

/// The demo's containers:
///
/// | container | GPU | mode | SM target | memory limit | workload |
/// |---|---|---|---|---|---|
/// | train-a | 0 | hard | 50 | 20000 MiB | 16000 MiB, saturating |
/// | serve-b | 0 | hard | 20 → 40 halfway | 8000 MiB | 6000 MiB, saturating |
/// | batch-c | 1 | elastic | 30 | 8000 MiB | 4000 MiB, saturating, alone (takes the idle SMs) |
/// | greedy-d | 2 | hard | 25 | 4000 MiB | 500 MiB chunks until refused, then saturating |
/// | infer-e | 3 | hard | 30 | 6000 MiB | 2000 MiB, saturating |
/// | etl-f | 3 | elastic | 20 | 6000 MiB | 3000 MiB, saturating (gets what infer-e leaves) |
pub(super) fn plans() -> Vec<Plan> {
    let p = |name, gpu, mode, sm_target, change_to, memory_mib, work| Plan {
        name,
        gpu,
        mode,
        sm_target,
        change_to,
        memory_mib,
        work,
    };
    use Mode::{Elastic, Hard};
    use Work::{Saturate, UntilOom};
    vec![
        p(
            "train-a",
            0,
            Hard,
            50,
            None,
            20_000,
            Saturate { alloc_mib: 16_000 },
        ),
        p(
            "serve-b",
            0,
            Hard,
            20,
            Some(40),
            8_000,
            Saturate { alloc_mib: 6_000 },
        ),
        p(
            "batch-c",
            1,
            Elastic,
            30,
            None,
            8_000,
            Saturate { alloc_mib: 4_000 },
        ),
        p(
            "greedy-d",
            2,
            Hard,
            25,
            None,
            4_000,
            UntilOom { chunk_mib: 500 },
        ),
        p(
            "infer-e",
            3,
            Hard,
            30,
            None,
            6_000,
            Saturate { alloc_mib: 2_000 },
        ),
        p(
            "etl-f",
            3,
            Elastic,
            20,
            None,
            6_000,
            Saturate { alloc_mib: 3_000 },
        ),
    ]
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn the_plans_cover_what_the_demo_shows() {
        let plans = plans();
        // A GPU shared by 2–3 containers with different targets.
        let on0: Vec<u32> = plans
            .iter()
            .filter(|p| p.gpu == 0)
            .map(|p| p.sm_target)
            .collect();
        assert!((2..=3).contains(&on0.len()) && on0[0] != on0[1], "{on0:?}");
        // An elastic container alone on its GPU.
        assert!(plans.iter().any(
            |p| p.mode == Mode::Elastic && plans.iter().filter(|o| o.gpu == p.gpu).count() == 1
        ));
        // One that allocates past its limit, one target changed live.
        assert_eq!(plans.iter().filter(|p| p.expects_oom()).count(), 1);
        assert_eq!(plans.iter().filter(|p| p.change_to.is_some()).count(), 1);
        // Every GPU's targets fit, before and after the change.
        for g in 0..GPUS {
            let sum = |after: bool| -> u32 {
                plans
                    .iter()
                    .filter(|p| p.gpu == g)
                    .map(|p| match (after, p.change_to) {
                        (true, Some(t)) => t,
                        _ => p.sm_target,
                    })
                    .sum()
            };
            assert!(sum(false) <= 100 && sum(true) <= 100, "GPU {g}");
        }
        // Each allocation fits its limit with the context overhead.
        for p in &plans {
            if let Work::Saturate { alloc_mib } = p.work {
                assert!(
                    alloc_mib + CONTEXT_OVERHEAD_MIB <= p.memory_mib,
                    "{}",
                    p.name
                );
            }
        }
        assert_eq!(
            plans[3].ops(plans[3].gpu, 1000),
            "dev 2 ready alloc-until-oom 500 meminfo run spin 1 256 1000"
        );
        assert_eq!(
            plans[0].ops(0, 1000),
            "dev 0 alloc 16000 ready run spin 1 256 1000"
        );
        assert_eq!(plans[3].pod_gpumem_mib(), 3500);
        assert_eq!(
            plans[0].gpu_spec("GPU-x"),
            "GPU-x,memory=20000,overhead=500"
        );
    }

    #[test]
    fn the_node_has_the_gpus_and_charges_the_overhead_the_limits_count() {
        let node = gpusim::NodeDescription::parse(&node_toml(), Path::new("demo")).unwrap();
        assert_eq!(node.gpu.len(), GPUS);
        assert_eq!(node.cost.context_overhead_mib, CONTEXT_OVERHEAD_MIB);
        assert!(same_node(&node));
        // The cluster's default node is this one, so `demo --cluster` can
        // run on a cluster brought up without `--node`.
        let cluster =
            gpusim::NodeDescription::parse(crate::cluster::gpu::DEFAULT_NODE, Path::new("cluster"))
                .unwrap();
        assert!(same_node(&cluster));
        let mut other = node;
        other.gpu.pop();
        assert!(!same_node(&other));
    }
}
