//! Which hook answers a `cuGetProcAddress` request.
//!
//! The driver picks an entry-point variant from the base name, the
//! caller's CUDA version and the per-thread-stream flag, and hands out its
//! address — which need not be the address of the exported symbol. So the
//! hook is chosen by the same rule, by name: the newest variant of the
//! base name not newer than the requested version (from the
//! `PFN_<name>_v<version>` typedefs), the per-thread one (`_ptsz`) when
//! the flag asks for it and one exists at that version. Names not listed
//! here are not hooked and keep the driver's answer.

use crate::hooks;

/// `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`.
const PER_THREAD: u64 = 1 << 1;

/// One variant of an entry point: (first CUDA version, per-thread, hook
/// symbol).
type Variant = (i32, bool, &'static str);

/// (base name, its variants), sorted by name.
const VARIANTS: &[(&str, &[Variant])] = &[
    (
        "cuArray3DCreate",
        &[
            (2000, false, "cuArray3DCreate"),
            (3020, false, "cuArray3DCreate_v2"),
        ],
    ),
    (
        "cuArrayCreate",
        &[
            (2000, false, "cuArrayCreate"),
            (3020, false, "cuArrayCreate_v2"),
        ],
    ),
    ("cuArrayDestroy", &[(2000, false, "cuArrayDestroy")]),
    (
        "cuCtxCreate",
        &[
            (2000, false, "cuCtxCreate"),
            (3020, false, "cuCtxCreate_v2"),
            (11040, false, "cuCtxCreate_v3"),
            (12050, false, "cuCtxCreate_v4"),
        ],
    ),
    (
        "cuCtxDestroy",
        &[
            (2000, false, "cuCtxDestroy"),
            (4000, false, "cuCtxDestroy_v2"),
        ],
    ),
    (
        "cuDeviceGetDefaultMemPool",
        &[(11020, false, "cuDeviceGetDefaultMemPool")],
    ),
    (
        "cuDeviceGetMemPool",
        &[(11020, false, "cuDeviceGetMemPool")],
    ),
    (
        "cuDevicePrimaryCtxRelease",
        &[
            (7000, false, "cuDevicePrimaryCtxRelease"),
            (11000, false, "cuDevicePrimaryCtxRelease_v2"),
        ],
    ),
    (
        "cuDevicePrimaryCtxReset",
        &[
            (7000, false, "cuDevicePrimaryCtxReset"),
            (11000, false, "cuDevicePrimaryCtxReset_v2"),
        ],
    ),
    (
        "cuDevicePrimaryCtxRetain",
        &[(7000, false, "cuDevicePrimaryCtxRetain")],
    ),
    ("cuDeviceTotalMem", &[(3020, false, "cuDeviceTotalMem_v2")]),
    (
        "cuGetProcAddress",
        &[
            (11030, false, "cuGetProcAddress"),
            (12000, false, "cuGetProcAddress_v2"),
        ],
    ),
    (
        "cuGraphAddMemAllocNode",
        &[(11040, false, "cuGraphAddMemAllocNode")],
    ),
    (
        "cuGraphAddNode",
        &[
            (12020, false, "cuGraphAddNode"),
            (12030, false, "cuGraphAddNode_v2"),
        ],
    ),
    (
        "cuGraphExecChildGraphNodeSetParams",
        &[(11010, false, "cuGraphExecChildGraphNodeSetParams")],
    ),
    (
        "cuGraphExecDestroy",
        &[(10000, false, "cuGraphExecDestroy")],
    ),
    (
        "cuGraphExecKernelNodeSetParams",
        &[
            (10010, false, "cuGraphExecKernelNodeSetParams"),
            (12000, false, "cuGraphExecKernelNodeSetParams_v2"),
        ],
    ),
    (
        "cuGraphExecNodeSetParams",
        &[(12020, false, "cuGraphExecNodeSetParams")],
    ),
    (
        "cuGraphExecUpdate",
        &[
            (10020, false, "cuGraphExecUpdate"),
            (12000, false, "cuGraphExecUpdate_v2"),
        ],
    ),
    (
        "cuGraphInstantiate",
        &[
            (10000, false, "cuGraphInstantiate_v2"),
            (12000, false, "cuGraphInstantiateWithFlags"),
        ],
    ),
    (
        "cuGraphInstantiateWithFlags",
        &[(11040, false, "cuGraphInstantiateWithFlags")],
    ),
    (
        "cuGraphInstantiateWithParams",
        &[
            (12000, false, "cuGraphInstantiateWithParams"),
            (12000, true, "cuGraphInstantiateWithParams_ptsz"),
        ],
    ),
    (
        "cuGraphLaunch",
        &[
            (10000, false, "cuGraphLaunch"),
            (10000, true, "cuGraphLaunch_ptsz"),
        ],
    ),
    ("cuInit", &[(2000, false, "cuInit")]),
    ("cuLaunch", &[(2000, false, "cuLaunch")]),
    (
        "cuLaunchCooperativeKernel",
        &[
            (9000, false, "cuLaunchCooperativeKernel"),
            (9000, true, "cuLaunchCooperativeKernel_ptsz"),
        ],
    ),
    ("cuLaunchGrid", &[(2000, false, "cuLaunchGrid")]),
    ("cuLaunchGridAsync", &[(2000, false, "cuLaunchGridAsync")]),
    (
        "cuLaunchKernel",
        &[
            (4000, false, "cuLaunchKernel"),
            (7000, true, "cuLaunchKernel_ptsz"),
        ],
    ),
    (
        "cuLaunchKernelEx",
        &[
            (11060, false, "cuLaunchKernelEx"),
            (11060, true, "cuLaunchKernelEx_ptsz"),
        ],
    ),
    (
        "cuMemAlloc",
        &[(2000, false, "cuMemAlloc"), (3020, false, "cuMemAlloc_v2")],
    ),
    (
        "cuMemAllocAsync",
        &[
            (11020, false, "cuMemAllocAsync"),
            (11020, true, "cuMemAllocAsync_ptsz"),
        ],
    ),
    (
        "cuMemAllocFromPoolAsync",
        &[
            (11020, false, "cuMemAllocFromPoolAsync"),
            (11020, true, "cuMemAllocFromPoolAsync_ptsz"),
        ],
    ),
    ("cuMemAllocManaged", &[(6000, false, "cuMemAllocManaged")]),
    (
        "cuMemAllocPitch",
        &[
            (2000, false, "cuMemAllocPitch"),
            (3020, false, "cuMemAllocPitch_v2"),
        ],
    ),
    ("cuMemCreate", &[(10020, false, "cuMemCreate")]),
    ("cuMemFree", &[(3020, false, "cuMemFree_v2")]),
    (
        "cuMemFreeAsync",
        &[
            (11020, false, "cuMemFreeAsync"),
            (11020, true, "cuMemFreeAsync_ptsz"),
        ],
    ),
    (
        "cuMemGetInfo",
        &[
            (2000, false, "cuMemGetInfo"),
            (3020, false, "cuMemGetInfo_v2"),
        ],
    ),
    ("cuMemMap", &[(10020, false, "cuMemMap")]),
    ("cuMemPoolCreate", &[(11020, false, "cuMemPoolCreate")]),
    ("cuMemPoolDestroy", &[(11020, false, "cuMemPoolDestroy")]),
    ("cuMemPoolTrimTo", &[(11020, false, "cuMemPoolTrimTo")]),
    ("cuMemRelease", &[(10020, false, "cuMemRelease")]),
    (
        "cuMemRetainAllocationHandle",
        &[(11000, false, "cuMemRetainAllocationHandle")],
    ),
    ("cuMemUnmap", &[(10020, false, "cuMemUnmap")]),
    (
        "cuMipmappedArrayCreate",
        &[(5000, false, "cuMipmappedArrayCreate")],
    ),
    (
        "cuMipmappedArrayDestroy",
        &[(5000, false, "cuMipmappedArrayDestroy")],
    ),
];

/// The hook's address for a request the driver answered, if we hook it.
pub fn hook_for(name: &[u8], version: i32, flags: u64) -> Option<usize> {
    let i = VARIANTS
        .binary_search_by(|(n, _)| n.as_bytes().cmp(name))
        .ok()?;
    let variants = VARIANTS[i].1;
    let newest = |pt: bool| {
        variants
            .iter()
            .filter(|(v, p, _)| *p == pt && *v <= version)
            .max_by_key(|(v, _, _)| *v)
    };
    let chosen = if flags & PER_THREAD != 0 {
        newest(true).or_else(|| newest(false))
    } else {
        newest(false)
    }?;
    hooks::lookup(chosen.2.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_sorted_and_every_hook_exists() {
        assert!(VARIANTS.windows(2).all(|w| w[0].0 < w[1].0));
        for (name, variants) in VARIANTS {
            for (_, _, sym) in *variants {
                assert!(hooks::lookup(sym.as_bytes()).is_some(), "{name}: {sym}");
            }
        }
    }

    #[test]
    fn versions_and_flags_pick_the_variant() {
        let h = |s: &str| hooks::lookup(s.as_bytes());
        assert_eq!(hook_for(b"cuMemAlloc", 12080, 0), h("cuMemAlloc_v2"));
        assert_eq!(hook_for(b"cuMemAlloc", 2000, 0), h("cuMemAlloc"));
        assert_eq!(
            hook_for(b"cuLaunchKernel", 12080, PER_THREAD),
            h("cuLaunchKernel_ptsz")
        );
        assert_eq!(hook_for(b"cuLaunchKernel", 12080, 0), h("cuLaunchKernel"));
        assert_eq!(
            hook_for(b"cuGraphInstantiate", 12000, 0),
            h("cuGraphInstantiateWithFlags")
        );
        assert_eq!(hook_for(b"cuDeviceGetCount", 12080, 0), None);
        assert_eq!(hook_for(b"cuMemAllocAsync", 11000, 0), None);
        assert_eq!(hook_for(b"cuGraphAddNode", 12020, 0), h("cuGraphAddNode"));
        assert_eq!(
            hook_for(b"cuGraphAddNode", 12080, 0),
            h("cuGraphAddNode_v2")
        );
        assert_eq!(hook_for(b"cuGraphAddNode", 12010, 0), None);
    }
}
