//! `GetPreferredAllocation`: which of the available vGPUs a container
//! should get.
//!
//! A request for `n` vGPUs means `n` distinct physical GPUs.
//! For `n > 1` the choice maximises, in order: NVLink-connected pairs among
//! the chosen GPUs, pairs on the same NUMA node, then the placement policy
//! (binpack: the fullest GPUs; spread: the emptiest). For one vGPU only
//! the placement policy decides. Ties go to the lower GPU index. Within a
//! GPU the lowest free replica is taken. `must_include` devices are always
//! part of the answer. The answer is a hint: kubelet fills up what it
//! lacks, and `Allocate` checks what it gets.

use std::collections::BTreeMap;

use crate::gpu::InventoryGpu;

use super::vgpu::VgpuId;

/// How single-vGPU requests are placed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Placement {
    /// Fill the fullest GPU first (keeps whole GPUs free).
    #[default]
    Binpack,
    /// Use the emptiest GPU first (less contention).
    Spread,
}

/// Exhaustive search up to this many candidate sets; greedy beyond.
const EXHAUSTIVE_LIMIT: u64 = 20_000;

/// One candidate GPU: its inventory entry, free replicas (sorted).
struct Candidate<'a> {
    gpu: &'a InventoryGpu,
    free: Vec<u32>,
}

/// The preferred `size` device IDs out of `available`, always containing
/// `must_include`. IDs that are not vGPU IDs of `gpus` are ignored; the
/// split count is `split` (to tell how full a GPU is).
pub fn preferred(
    gpus: &[InventoryGpu],
    split: u32,
    placement: Placement,
    available: &[String],
    must_include: &[String],
    size: usize,
) -> Vec<String> {
    let mut by_gpu: BTreeMap<u32, Candidate<'_>> = BTreeMap::new();
    for id in available {
        let Ok(v) = id.parse::<VgpuId>() else {
            continue;
        };
        let Some(g) = gpus.iter().find(|g| g.uuid == v.uuid) else {
            continue;
        };
        by_gpu
            .entry(g.index)
            .or_insert_with(|| Candidate {
                gpu: g,
                free: vec![],
            })
            .free
            .push(v.replica);
    }
    for c in by_gpu.values_mut() {
        c.free.sort_unstable();
        c.free.dedup();
    }
    let mut out: Vec<String> = must_include.to_vec();
    let fixed: Vec<u32> = must_include
        .iter()
        .filter_map(|id| id.parse::<VgpuId>().ok())
        .filter_map(|v| gpus.iter().find(|g| g.uuid == v.uuid).map(|g| g.index))
        .collect();
    if out.len() >= size {
        return out;
    }
    let want = size - out.len();
    let pool: Vec<&Candidate<'_>> = by_gpu
        .values()
        .filter(|c| !fixed.contains(&c.gpu.index))
        .filter(|c| c.free.iter().any(|r| !out.contains(&id(c, *r))))
        .collect();
    let fixed_gpus: Vec<&InventoryGpu> = fixed
        .iter()
        .filter_map(|i| gpus.iter().find(|g| g.index == *i))
        .collect();
    let score = |set: &[&Candidate<'_>]| -> (u32, u32, i64, i64) {
        let all: Vec<&InventoryGpu> = fixed_gpus
            .iter()
            .copied()
            .chain(set.iter().map(|c| c.gpu))
            .collect();
        let (mut links, mut numa) = (0, 0);
        for (i, a) in all.iter().enumerate() {
            for b in &all[i + 1..] {
                links += u32::from(a.nvlink_peers.contains(&b.index));
                numa += u32::from(a.numa_node.is_some() && a.numa_node == b.numa_node);
            }
        }
        let used: i64 = set
            .iter()
            .map(|c| i64::from(split) - c.free.len() as i64)
            .sum();
        let fill = match placement {
            Placement::Binpack => used,
            Placement::Spread => -used,
        };
        // Lower indices win ties: a larger value of the negated sum.
        let order = -set.iter().map(|c| i64::from(c.gpu.index)).sum::<i64>();
        (links, numa, fill, order)
    };
    let chosen = if combinations(pool.len() as u64, want as u64) <= EXHAUSTIVE_LIMIT {
        best_subset(&pool, want, &score)
    } else {
        greedy(&pool, want, &score)
    };
    for c in chosen {
        if let Some(r) = c.free.iter().find(|r| !out.contains(&id(c, **r))) {
            out.push(id(c, *r));
        }
    }
    out
}

fn id(c: &Candidate<'_>, replica: u32) -> String {
    VgpuId {
        uuid: c.gpu.uuid.clone(),
        replica,
    }
    .to_string()
}

/// `n` choose `k`, saturating.
fn combinations(n: u64, k: u64) -> u64 {
    if k > n {
        return 0;
    }
    let k = k.min(n - k);
    (0..k).fold(1u64, |acc, i| acc.saturating_mul(n - i) / (i + 1))
}

type Score = (u32, u32, i64, i64);

/// The best-scoring subset of `want` elements of `pool` (all of `pool` when
/// it is smaller).
fn best_subset<'p, 'a>(
    pool: &[&'p Candidate<'a>],
    want: usize,
    score: &dyn Fn(&[&Candidate<'a>]) -> Score,
) -> Vec<&'p Candidate<'a>> {
    let k = want.min(pool.len());
    let mut idx: Vec<usize> = (0..k).collect();
    let mut best: Option<(Score, Vec<usize>)> = None;
    loop {
        let set: Vec<&Candidate<'a>> = idx.iter().map(|&i| pool[i]).collect();
        let s = score(&set);
        if best.as_ref().is_none_or(|(b, _)| s > *b) {
            best = Some((s, idx.clone()));
        }
        // Next combination in lexicographic order.
        let Some(pos) = (0..k).rev().find(|&i| idx[i] != i + pool.len() - k) else {
            break;
        };
        idx[pos] += 1;
        for j in pos + 1..k {
            idx[j] = idx[j - 1] + 1;
        }
    }
    best.map(|(_, v)| v.into_iter().map(|i| pool[i]).collect())
        .unwrap_or_default()
}

/// From every GPU as a seed, adds one GPU at a time, the one that scores
/// best with those chosen; keeps the best-scoring result.
fn greedy<'p, 'a>(
    pool: &[&'p Candidate<'a>],
    want: usize,
    score: &dyn Fn(&[&Candidate<'a>]) -> Score,
) -> Vec<&'p Candidate<'a>> {
    let mut best: Option<(Score, Vec<&'p Candidate<'a>>)> = None;
    for seed in pool {
        let mut chosen: Vec<&'p Candidate<'a>> = vec![seed];
        while chosen.len() < want {
            let next = pool
                .iter()
                .filter(|c| !chosen.iter().any(|x| x.gpu.index == c.gpu.index))
                .max_by_key(|c| {
                    let mut set: Vec<&Candidate<'a>> = chosen.iter().map(|c| &**c).collect();
                    set.push(c);
                    score(&set)
                });
            let Some(next) = next else { break };
            chosen.push(next);
        }
        let set: Vec<&Candidate<'a>> = chosen.iter().map(|c| &**c).collect();
        let s = score(&set);
        if best.as_ref().is_none_or(|(b, _)| s > *b) {
            best = Some((s, chosen));
        }
    }
    best.map(|(_, v)| v).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::{FakeBackend, FakeGpu, Inventory};

    /// 4 GPUs: 0–1 NVLinked on NUMA 0, 2 on NUMA 0 without links, 3 on
    /// NUMA 1 linked to 2.
    fn gpus() -> Vec<InventoryGpu> {
        let mut g: Vec<FakeGpu> = (0..4).map(|i| FakeGpu::new(i, "G", 1000)).collect();
        let bus: Vec<String> = g.iter().map(|x| x.device.pci_bus_id.clone()).collect();
        g[0].device.nvlink_remote_bus_ids = vec![bus[1].clone()];
        g[1].device.nvlink_remote_bus_ids = vec![bus[0].clone()];
        g[2].device.nvlink_remote_bus_ids = vec![bus[3].clone()];
        g[3].device.nvlink_remote_bus_ids = vec![bus[2].clone()];
        g[3].device.numa_node = Some(1);
        Inventory::collect(&FakeBackend::new(g)).unwrap().gpus
    }

    fn all(gpus: &[InventoryGpu], split: u32) -> Vec<String> {
        gpus.iter()
            .flat_map(|g| (0..split).map(move |r| format!("{}::{r}", g.uuid)))
            .collect()
    }

    fn gpu_of(gpus: &[InventoryGpu], id: &str) -> u32 {
        let v: VgpuId = id.parse().unwrap();
        gpus.iter().find(|g| g.uuid == v.uuid).unwrap().index
    }

    #[test]
    fn two_gpus_prefer_the_nvlinked_pair_on_one_numa_node() {
        let g = gpus();
        let got = preferred(&g, 4, Placement::Binpack, &all(&g, 4), &[], 2);
        let mut idx: Vec<u32> = got.iter().map(|i| gpu_of(&g, i)).collect();
        idx.sort_unstable();
        assert_eq!(idx, vec![0, 1], "{got:?}");

        // GPU 0 busy: 2–3 are linked (across NUMA), 1–2 share NUMA 0 only;
        // the link wins.
        let avail: Vec<String> = all(&g, 4)
            .into_iter()
            .filter(|i| gpu_of(&g, i) != 0)
            .collect();
        let got = preferred(&g, 4, Placement::Binpack, &avail, &[], 2);
        let mut idx: Vec<u32> = got.iter().map(|i| gpu_of(&g, i)).collect();
        idx.sort_unstable();
        assert_eq!(idx, vec![2, 3], "{got:?}");
    }

    #[test]
    fn must_include_is_kept_and_its_link_counts() {
        let g = gpus();
        let must = vec![format!("{}::1", g[3].uuid)];
        let got = preferred(&g, 4, Placement::Binpack, &all(&g, 4), &must, 2);
        assert_eq!(got[0], must[0]);
        assert_eq!(gpu_of(&g, &got[1]), 2, "{got:?}");
        assert_eq!(got.len(), 2);
    }

    #[test]
    fn single_requests_follow_binpack_or_spread() {
        let g = gpus();
        // GPU 2 has 3 of 4 replicas used, GPU 1 has 1 used; 0 and 3 are empty.
        let avail: Vec<String> = all(&g, 4)
            .into_iter()
            .filter(|i| {
                let v: VgpuId = i.parse().unwrap();
                let n = gpu_of(&g, i);
                !((n == 2 && v.replica < 3) || (n == 1 && v.replica == 0))
            })
            .collect();
        let got = preferred(&g, 4, Placement::Binpack, &avail, &[], 1);
        assert_eq!(got, vec![format!("{}::3", g[2].uuid)]);
        let got = preferred(&g, 4, Placement::Spread, &avail, &[], 1);
        assert_eq!(got, vec![format!("{}::0", g[0].uuid)]);
    }

    #[test]
    fn distinct_gpus_only_and_foreign_ids_ignored() {
        let g = gpus();
        let avail = vec![
            format!("{}::0", g[0].uuid),
            format!("{}::1", g[0].uuid),
            "not-a-vgpu".to_owned(),
            "GPU-ffffffff-0000-0000-0000-000000000000::0".to_owned(),
        ];
        let got = preferred(&g, 4, Placement::Binpack, &avail, &[], 2);
        assert_eq!(got, vec![format!("{}::0", g[0].uuid)]);
    }

    #[test]
    fn many_gpus_use_the_greedy_search() {
        let mut v: Vec<FakeGpu> = (0..24).map(|i| FakeGpu::new(i, "G", 1000)).collect();
        let b10 = v[10].device.pci_bus_id.clone();
        let b11 = v[11].device.pci_bus_id.clone();
        v[11].device.nvlink_remote_bus_ids = vec![b10];
        v[10].device.nvlink_remote_bus_ids = vec![b11];
        let g = Inventory::collect(&FakeBackend::new(v)).unwrap().gpus;
        assert!(combinations(24, 8) > EXHAUSTIVE_LIMIT);
        let got = preferred(&g, 2, Placement::Binpack, &all(&g, 2), &[], 8);
        let idx: Vec<u32> = got.iter().map(|i| gpu_of(&g, i)).collect();
        assert_eq!(idx.len(), 8);
        assert!(idx.contains(&10) && idx.contains(&11), "{idx:?}");
        let mut d = idx.clone();
        d.sort_unstable();
        d.dedup();
        assert_eq!(d.len(), 8, "distinct GPUs: {idx:?}");
    }
}
