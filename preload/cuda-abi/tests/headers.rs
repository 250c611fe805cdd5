//! Every size, field offset and constant in `tessera-cuda-abi` is what
//! NVIDIA's own headers say, as a C compiler reads them.
//!
//! The headers come from NVIDIA's wheels `nvidia-cuda-runtime-cu12`
//! (`cuda.h`) and `nvidia-nvml-dev-cu12` (`nvml.h`), which `cargo xtask
//! setup` unpacks into `target/tools/nvidia-headers/include`
//! (`TESSERA_NVIDIA_INCLUDE` overrides). The test writes one C program that
//! prints each expression, compiles it against the headers, and compares
//! the output with the Rust values. Completeness is checked too: every
//! `pub const` and `pub struct` in the crate's sources must be covered, so a
//! new declaration cannot slip in unchecked.

use std::collections::BTreeMap;
use std::mem::{offset_of, size_of};
use std::path::PathBuf;
use std::process::Command;

use tessera_cuda_abi::{cuda, nvml};

/// One comparison: a C expression and the value Rust has for it.
struct Check {
    what: String,
    c_expr: String,
    rust: i128,
}

/// Constants whose value Rust declares and the header has no name for
/// (our own derived values), with why.
const OURS: &[(&str, &str)] = &[(
    "NO_INSTANCE",
    "instance id the NVML stand-in reports without MIG",
)];

/// C expressions for constants whose doc does not name a C macro or enum.
const EXPRESSIONS: &[(&str, &str)] = &[
    // The `_v1`/`_v2` pci-info size: everything before `busId`, then the 16
    // reserved bytes older headers had in its place.
    (
        "PCI_INFO_LEGACY_SIZE",
        "offsetof(nvmlPciInfo_t, busId) + 16",
    ),
];

macro_rules! values {
    ($module:ident: $($name:ident),* $(,)?) => {
        [$((stringify!($name), $module::$name as i128)),*]
    };
}

/// Every Rust constant's compiled value, by name.
fn rust_values() -> BTreeMap<&'static str, i128> {
    let mut out = BTreeMap::new();
    use cuda::result;
    out.extend(values!(result:
        CUDA_SUCCESS, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_OUT_OF_MEMORY,
        CUDA_ERROR_NOT_INITIALIZED, CUDA_ERROR_DEINITIALIZED, CUDA_ERROR_PROFILER_DISABLED,
        CUDA_ERROR_PROFILER_NOT_INITIALIZED, CUDA_ERROR_PROFILER_ALREADY_STARTED,
        CUDA_ERROR_PROFILER_ALREADY_STOPPED, CUDA_ERROR_STUB_LIBRARY,
        CUDA_ERROR_DEVICE_UNAVAILABLE, CUDA_ERROR_NO_DEVICE, CUDA_ERROR_INVALID_DEVICE,
        CUDA_ERROR_DEVICE_NOT_LICENSED, CUDA_ERROR_INVALID_IMAGE, CUDA_ERROR_INVALID_CONTEXT,
        CUDA_ERROR_CONTEXT_ALREADY_CURRENT, CUDA_ERROR_MAP_FAILED, CUDA_ERROR_UNMAP_FAILED,
        CUDA_ERROR_ARRAY_IS_MAPPED, CUDA_ERROR_ALREADY_MAPPED, CUDA_ERROR_NO_BINARY_FOR_GPU,
        CUDA_ERROR_ALREADY_ACQUIRED, CUDA_ERROR_NOT_MAPPED, CUDA_ERROR_NOT_MAPPED_AS_ARRAY,
        CUDA_ERROR_NOT_MAPPED_AS_POINTER, CUDA_ERROR_ECC_UNCORRECTABLE,
        CUDA_ERROR_UNSUPPORTED_LIMIT, CUDA_ERROR_CONTEXT_ALREADY_IN_USE,
        CUDA_ERROR_PEER_ACCESS_UNSUPPORTED, CUDA_ERROR_INVALID_PTX,
        CUDA_ERROR_INVALID_GRAPHICS_CONTEXT, CUDA_ERROR_NVLINK_UNCORRECTABLE,
        CUDA_ERROR_JIT_COMPILER_NOT_FOUND, CUDA_ERROR_UNSUPPORTED_PTX_VERSION,
        CUDA_ERROR_JIT_COMPILATION_DISABLED, CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY,
        CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC, CUDA_ERROR_INVALID_SOURCE,
        CUDA_ERROR_FILE_NOT_FOUND, CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND,
        CUDA_ERROR_SHARED_OBJECT_INIT_FAILED, CUDA_ERROR_OPERATING_SYSTEM,
        CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_ILLEGAL_STATE, CUDA_ERROR_LOSSY_QUERY,
        CUDA_ERROR_NOT_FOUND, CUDA_ERROR_NOT_READY, CUDA_ERROR_ILLEGAL_ADDRESS,
        CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, CUDA_ERROR_LAUNCH_TIMEOUT,
        CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING, CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED,
        CUDA_ERROR_PEER_ACCESS_NOT_ENABLED, CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE,
        CUDA_ERROR_CONTEXT_IS_DESTROYED, CUDA_ERROR_ASSERT, CUDA_ERROR_TOO_MANY_PEERS,
        CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED,
        CUDA_ERROR_HARDWARE_STACK_ERROR, CUDA_ERROR_ILLEGAL_INSTRUCTION,
        CUDA_ERROR_MISALIGNED_ADDRESS, CUDA_ERROR_INVALID_ADDRESS_SPACE, CUDA_ERROR_INVALID_PC,
        CUDA_ERROR_LAUNCH_FAILED, CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE,
        CUDA_ERROR_NOT_PERMITTED, CUDA_ERROR_NOT_SUPPORTED, CUDA_ERROR_SYSTEM_NOT_READY,
        CUDA_ERROR_SYSTEM_DRIVER_MISMATCH, CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE,
        CUDA_ERROR_MPS_CONNECTION_FAILED, CUDA_ERROR_MPS_RPC_FAILURE,
        CUDA_ERROR_MPS_SERVER_NOT_READY, CUDA_ERROR_MPS_MAX_CLIENTS_REACHED,
        CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED, CUDA_ERROR_MPS_CLIENT_TERMINATED,
        CUDA_ERROR_CDP_NOT_SUPPORTED, CUDA_ERROR_CDP_VERSION_MISMATCH,
        CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
        CUDA_ERROR_STREAM_CAPTURE_MERGE, CUDA_ERROR_STREAM_CAPTURE_UNMATCHED,
        CUDA_ERROR_STREAM_CAPTURE_UNJOINED, CUDA_ERROR_STREAM_CAPTURE_ISOLATION,
        CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, CUDA_ERROR_CAPTURED_EVENT,
        CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, CUDA_ERROR_TIMEOUT,
        CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE, CUDA_ERROR_EXTERNAL_DEVICE,
        CUDA_ERROR_INVALID_CLUSTER_SIZE, CUDA_ERROR_FUNCTION_NOT_LOADED,
        CUDA_ERROR_INVALID_RESOURCE_TYPE, CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION,
        CUDA_ERROR_UNKNOWN,
    ));
    out.extend(values!(cuda:
        CU_STREAM_LEGACY, CU_STREAM_PER_THREAD, CU_EVENT_DISABLE_TIMING,
        CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, CU_GET_PROC_ADDRESS_SUCCESS,
        CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT,
        CU_MEM_LOCATION_TYPE_DEVICE, CU_MEM_ALLOCATION_TYPE_PINNED, CU_GRAPH_NODE_TYPE_KERNEL,
        CU_GRAPH_NODE_TYPE_GRAPH, CU_GRAPH_NODE_TYPE_EMPTY, CU_GRAPH_NODE_TYPE_MEM_ALLOC, CU_GRAPH_NODE_TYPE_MEM_FREE,
        CU_MEM_ALLOC_GRANULARITY_MINIMUM, CU_STREAM_CAPTURE_STATUS_NONE,
        CU_STREAM_CAPTURE_STATUS_ACTIVE, CU_POINTER_ATTRIBUTE_CONTEXT,
        CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_POINTER,
        CU_POINTER_ATTRIBUTE_HOST_POINTER, CU_POINTER_ATTRIBUTE_IS_MANAGED,
        CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
        CU_POINTER_ATTRIBUTE_RANGE_SIZE, CU_MEMORYTYPE_HOST, CU_MEMORYTYPE_DEVICE,
    ));
    use cuda::attr;
    out.extend(values!(attr:
        MAX_THREADS_PER_BLOCK, MAX_BLOCK_DIM_X, MAX_BLOCK_DIM_Y, MAX_BLOCK_DIM_Z,
        MAX_GRID_DIM_X, MAX_GRID_DIM_Y, MAX_GRID_DIM_Z, MAX_SHARED_MEMORY_PER_BLOCK,
        TOTAL_CONSTANT_MEMORY, WARP_SIZE, MAX_PITCH, MAX_REGISTERS_PER_BLOCK, CLOCK_RATE,
        TEXTURE_ALIGNMENT, GPU_OVERLAP, MULTIPROCESSOR_COUNT, KERNEL_EXEC_TIMEOUT, INTEGRATED,
        CAN_MAP_HOST_MEMORY, COMPUTE_MODE, CONCURRENT_KERNELS, ECC_ENABLED, PCI_BUS_ID,
        PCI_DEVICE_ID, TCC_DRIVER, MEMORY_CLOCK_RATE, GLOBAL_MEMORY_BUS_WIDTH, L2_CACHE_SIZE,
        MAX_THREADS_PER_MULTIPROCESSOR, ASYNC_ENGINE_COUNT, UNIFIED_ADDRESSING, PCI_DOMAIN_ID,
        TEXTURE_PITCH_ALIGNMENT, COMPUTE_CAPABILITY_MAJOR, COMPUTE_CAPABILITY_MINOR,
        STREAM_PRIORITIES_SUPPORTED, GLOBAL_L1_CACHE_SUPPORTED, LOCAL_L1_CACHE_SUPPORTED,
        MAX_SHARED_MEMORY_PER_MULTIPROCESSOR, MAX_REGISTERS_PER_MULTIPROCESSOR, MANAGED_MEMORY,
        MULTI_GPU_BOARD, MULTI_GPU_BOARD_GROUP_ID, PAGEABLE_MEMORY_ACCESS,
        CONCURRENT_MANAGED_ACCESS, COMPUTE_PREEMPTION_SUPPORTED, COOPERATIVE_LAUNCH,
        MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, HOST_REGISTER_SUPPORTED,
        VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, MAX_BLOCKS_PER_MULTIPROCESSOR,
        MEMORY_POOLS_SUPPORTED,
    ));
    out.extend(values!(nvml:
        SUCCESS, ERROR_UNINITIALIZED, ERROR_INVALID_ARGUMENT, ERROR_NOT_SUPPORTED,
        ERROR_NO_PERMISSION, ERROR_NOT_FOUND, ERROR_INSUFFICIENT_SIZE, ERROR_DRIVER_NOT_LOADED,
        ERROR_TIMEOUT, ERROR_FUNCTION_NOT_FOUND, ERROR_GPU_IS_LOST,
        ERROR_ARGUMENT_VERSION_MISMATCH, ERROR_UNKNOWN, PCI_BUS_ID_BUFFER_SIZE,
        PCI_BUS_ID_LEGACY_BUFFER_SIZE, NVLINK_MAX_LINKS, API_VERSION, FEATURE_DISABLED,
        FEATURE_ENABLED, MIG_DISABLE, MIG_ENABLE, TOPOLOGY_INTERNAL, TOPOLOGY_NODE,
        TOPOLOGY_SYSTEM, TEMPERATURE_GPU, CLOCK_GRAPHICS, CLOCK_SM, CLOCK_MEM, CLOCK_VIDEO,
        EVENT_SINGLE_BIT_ECC, EVENT_XID_CRITICAL_ERROR, EVENT_ALL, NO_INSTANCE, MEMORY_V2,
        PCI_INFO_LEGACY_SIZE,
    ));
    out
}

/// `(rust struct, C type, [(rust field path, C field)])` with sizes and
/// offsets from the compiler.
macro_rules! layout {
    ($checks:ident, $module:ident::$rust:ident => $c:literal { $($field:ident $(. $sub:ident)* => $cf:literal),* $(,)? }) => {{
        $checks.push(Check {
            what: format!("size of {}", stringify!($rust)),
            c_expr: format!("sizeof({})", $c),
            rust: size_of::<$module::$rust>() as i128,
        });
        $($checks.push(Check {
            what: format!("offset of {}.{}", stringify!($rust), stringify!($field $(. $sub)*)),
            c_expr: format!("offsetof({}, {})", $c, $cf),
            rust: offset_of!($module::$rust, $field $(. $sub)*) as i128,
        });)*
        stringify!($rust)
    }};
}

fn layouts(checks: &mut Vec<Check>) -> Vec<&'static str> {
    vec![
        layout!(checks, cuda::CUuuid => "CUuuid" { bytes => "bytes" }),
        layout!(checks, cuda::CudaArrayDescriptor => "CUDA_ARRAY_DESCRIPTOR_v2" {
            width => "Width", height => "Height", format => "Format",
            num_channels => "NumChannels",
        }),
        layout!(checks, cuda::CudaArray3dDescriptor => "CUDA_ARRAY3D_DESCRIPTOR_v2" {
            width => "Width", height => "Height", depth => "Depth", format => "Format",
            num_channels => "NumChannels", flags => "Flags",
        }),
        layout!(checks, cuda::CUmemLocation => "CUmemLocation" { kind => "type", id => "id" }),
        layout!(checks, cuda::CUmemAllocationProp => "CUmemAllocationProp" {
            kind => "type", requested_handle_types => "requestedHandleTypes",
            location => "location", win32_handle_meta_data => "win32HandleMetaData",
            alloc_flags => "allocFlags",
        }),
        layout!(checks, cuda::CUmemAccessDesc => "CUmemAccessDesc" {
            location => "location", flags => "flags",
        }),
        layout!(checks, cuda::CUmemPoolProps => "CUmemPoolProps" {
            alloc_type => "allocType", handle_types => "handleTypes", location => "location",
            win32_security_attributes => "win32SecurityAttributes", max_size => "maxSize",
            usage => "usage", reserved => "reserved",
        }),
        layout!(checks, cuda::CUlaunchConfig => "CUlaunchConfig" {
            grid_dim_x => "gridDimX", grid_dim_y => "gridDimY", grid_dim_z => "gridDimZ",
            block_dim_x => "blockDimX", block_dim_y => "blockDimY", block_dim_z => "blockDimZ",
            shared_mem_bytes => "sharedMemBytes", h_stream => "hStream", attrs => "attrs",
            num_attrs => "numAttrs",
        }),
        layout!(checks, cuda::KernelNodeParamsV1 => "CUDA_KERNEL_NODE_PARAMS_v1" {
            func => "func", grid_dim_x => "gridDimX", grid_dim_y => "gridDimY",
            grid_dim_z => "gridDimZ", block_dim_x => "blockDimX", block_dim_y => "blockDimY",
            block_dim_z => "blockDimZ", shared_mem_bytes => "sharedMemBytes",
            kernel_params => "kernelParams", extra => "extra",
        }),
        layout!(checks, cuda::KernelNodeParamsV2 => "CUDA_KERNEL_NODE_PARAMS_v2" {
            v1.func => "func", v1.grid_dim_x => "gridDimX", v1.block_dim_z => "blockDimZ",
            v1.shared_mem_bytes => "sharedMemBytes", v1.kernel_params => "kernelParams",
            v1.extra => "extra", kern => "kern", ctx => "ctx",
        }),
        layout!(checks, cuda::MemAllocNodeParams => "CUDA_MEM_ALLOC_NODE_PARAMS_v1" {
            pool_props => "poolProps", access_descs => "accessDescs",
            access_desc_count => "accessDescCount", bytesize => "bytesize", dptr => "dptr",
        }),
        layout!(checks, cuda::GraphNodeParams => "CUgraphNodeParams" {
            kind => "type", reserved0 => "reserved0", body => "reserved1",
            body.kernel => "kernel", body.graph => "graph", body.alloc => "alloc",
            body.free => "free", reserved2 => "reserved2",
        }),
        {
            checks.push(Check {
                what: "size of GraphNodeBody".into(),
                c_expr: "sizeof(((CUgraphNodeParams *)0)->reserved1)".into(),
                rust: size_of::<cuda::GraphNodeBody>() as i128,
            });
            "GraphNodeBody"
        },
        layout!(checks, cuda::GraphInstantiateParams => "CUDA_GRAPH_INSTANTIATE_PARAMS" {
            flags => "flags", upload_stream => "hUploadStream", err_node_out => "hErrNode_out",
            result_out => "result_out",
        }),
        layout!(checks, cuda::CudaArrayDescriptorV1 => "CUDA_ARRAY_DESCRIPTOR_v1" {
            width => "Width", height => "Height", format => "Format",
            num_channels => "NumChannels",
        }),
        layout!(checks, cuda::CudaArray3dDescriptorV1 => "CUDA_ARRAY3D_DESCRIPTOR_v1" {
            width => "Width", height => "Height", depth => "Depth", format => "Format",
            num_channels => "NumChannels", flags => "Flags",
        }),
        layout!(checks, nvml::Memory => "nvmlMemory_t" {
            total => "total", free => "free", used => "used",
        }),
        layout!(checks, nvml::MemoryV2 => "nvmlMemory_v2_t" {
            version => "version", total => "total", reserved => "reserved", free => "free",
            used => "used",
        }),
        layout!(checks, nvml::Utilization => "nvmlUtilization_t" {
            gpu => "gpu", memory => "memory",
        }),
        layout!(checks, nvml::ProcessInfoV1 => "nvmlProcessInfo_v1_t" {
            pid => "pid", used_gpu_memory => "usedGpuMemory",
        }),
        layout!(checks, nvml::ProcessInfo => "nvmlProcessInfo_v2_t" {
            pid => "pid", used_gpu_memory => "usedGpuMemory",
            gpu_instance_id => "gpuInstanceId", compute_instance_id => "computeInstanceId",
        }),
        layout!(checks, nvml::ProcessUtilizationSample => "nvmlProcessUtilizationSample_t" {
            pid => "pid", time_stamp => "timeStamp", sm_util => "smUtil",
            mem_util => "memUtil", enc_util => "encUtil", dec_util => "decUtil",
        }),
        layout!(checks, nvml::PciInfo => "nvmlPciInfo_t" {
            bus_id_legacy => "busIdLegacy", domain => "domain", bus => "bus",
            device => "device", pci_device_id => "pciDeviceId",
            pci_sub_system_id => "pciSubSystemId", bus_id => "busId",
        }),
        layout!(checks, nvml::EventData => "nvmlEventData_t" {
            device => "device", event_type => "eventType", event_data => "eventData",
            gpu_instance_id => "gpuInstanceId", compute_instance_id => "computeInstanceId",
        }),
        {
            // The v1-era event data is today's without the instance ids.
            checks.push(Check {
                what: "size of EventDataV1".into(),
                c_expr: "offsetof(nvmlEventData_t, gpuInstanceId)".into(),
                rust: size_of::<nvml::EventDataV1>() as i128,
            });
            "EventDataV1"
        },
    ]
}

/// `(rust name, C name from its doc comment)` for every `pub const` in a
/// source file; `prefix` names C constants of an undocumented module.
fn declared_constants(source: &str) -> Vec<(String, Option<String>)> {
    let mut out = Vec::new();
    let mut doc: Option<String> = None;
    let mut module_prefix: Option<&str> = None;
    for line in source.lines() {
        let t = line.trim();
        if t.starts_with("pub mod attr") {
            module_prefix = Some("CU_DEVICE_ATTRIBUTE_");
        }
        if let Some((name, after)) = t.strip_prefix("/// `").and_then(|r| r.split_once('`')) {
            let whole =
                after.trim().is_empty() || after.starts_with(['.', ':']) || after.starts_with(" (");
            if whole && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                doc = Some(name.to_owned());
                continue;
            }
        }
        if let Some(rest) = t.strip_prefix("pub const ") {
            if rest.starts_with("fn ") {
                doc = None;
                continue;
            }
            let name = rest.split(':').next().unwrap_or_default().trim().to_owned();
            let c = doc
                .take()
                .or_else(|| module_prefix.map(|p| format!("{p}{name}")));
            out.push((name, c));
            continue;
        }
        if !t.starts_with("///") && !t.starts_with("#[") {
            doc = None;
        }
    }
    out
}

fn declared_structs(source: &str) -> Vec<String> {
    source
        .lines()
        .filter_map(|l| l.trim().strip_prefix("pub struct "))
        .map(|rest| {
            rest.split([' ', '{', '('])
                .next()
                .unwrap_or_default()
                .to_owned()
        })
        .collect()
}

fn include_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("TESSERA_NVIDIA_INCLUDE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../../target/tools/nvidia-headers/include")
        });
    (dir.join("cuda.h").is_file() && dir.join("nvml.h").is_file()).then_some(dir)
}

#[test]
fn declarations_match_nvidias_headers() {
    let Some(include) = include_dir() else {
        println!(
            "skipped: NVIDIA's cuda.h and nvml.h are not in target/tools/nvidia-headers/include \
             (run `cargo xtask setup`, or set TESSERA_NVIDIA_INCLUDE)"
        );
        return;
    };
    let sources = [
        ("cuda/mod.rs", include_str!("../src/cuda/mod.rs")),
        ("cuda/result.rs", include_str!("../src/cuda/result.rs")),
        ("nvml.rs", include_str!("../src/nvml.rs")),
    ];
    let values = rust_values();
    let mut checks = Vec::new();
    let covered = layouts(&mut checks);
    let mut problems = Vec::new();
    for (file, source) in sources {
        for name in declared_structs(source) {
            if !covered.contains(&name.as_str()) {
                problems.push(format!("{file}: struct {name} has no layout check"));
            }
        }
        for (name, c) in declared_constants(source) {
            let Some(&rust) = values.get(name.as_str()) else {
                problems.push(format!("{file}: const {name} is not in rust_values()"));
                continue;
            };
            let expr = EXPRESSIONS
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, e)| (*e).to_owned())
                .or(c);
            match expr {
                Some(c_expr) => checks.push(Check {
                    what: format!("const {name}"),
                    c_expr,
                    rust,
                }),
                None if OURS.iter().any(|(n, _)| *n == name) => {}
                None => problems.push(format!("{file}: const {name} names no C counterpart")),
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));

    let dir = std::env::temp_dir().join(format!("tessera-cuda-abi-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let program = dir.join("layout.c");
    let mut c = String::from(
        // `__CUDA_API_VERSION_INTERNAL` also declares the pre-3.2 (`_v1`)
        // structures, which the 32-bit entry points take.
        "#include <stddef.h>\n#include <stdio.h>\n#define __CUDA_API_VERSION_INTERNAL 1\n\
         #include <cuda.h>\n#include <nvml.h>\n\
         int main(void) {\n",
    );
    for check in &checks {
        c.push_str(&format!(
            "    printf(\"%lld\\n\", (long long)({}));\n",
            check.c_expr
        ));
    }
    c.push_str("    return 0;\n}\n");
    std::fs::write(&program, c).unwrap();
    let exe = dir.join("layout");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(&cc)
        .args(["-std=c11", "-Wall", "-Werror", "-I"])
        .arg(&include)
        .arg(&program)
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap_or_else(|e| panic!("run {cc}: {e}"));
    assert!(
        out.status.success(),
        "compiling against {}:\n{}",
        include.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let printed = Command::new(&exe).output().unwrap();
    let text = String::from_utf8(printed.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), checks.len());
    let mismatches: Vec<String> = checks
        .iter()
        .zip(lines)
        .filter(|(check, line)| line.parse::<i128>().ok() != Some(check.rust))
        .map(|(check, line)| {
            format!(
                "{}: rust {} but {} is {line}",
                check.what, check.rust, check.c_expr
            )
        })
        .collect();
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
    println!(
        "{} sizes, offsets and constants match NVIDIA's headers",
        checks.len()
    );
    let _ = std::fs::remove_dir_all(&dir);
}
