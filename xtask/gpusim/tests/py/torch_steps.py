"""PyTorch's CUDA build on the simulated node, in steps the Rust test
checks against the simulator's record (xtask/gpusim/tests/torch_runtime.rs).

Usage: torch_steps.py basics|limit

Each step prints one line, `step <name> <json>`, then waits for a line on
stdin, so the test can read the node's state while the process holds what
the step allocated. Device memory holds no data on the simulator: values
read back are not checked, only that every call succeeds.
"""

import json
import sys
import warnings

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

import torch  # noqa: E402

MIB = 1 << 20


def step(step_name, **values):
    print("step", step_name, json.dumps(values), flush=True)
    sys.stdin.readline()


def stats():
    s = torch.cuda.memory_stats()
    return {
        "allocated": s["allocated_bytes.all.current"],
        "reserved": s["reserved_bytes.all.current"],
        "segments": s["segment.all.current"],
        "ooms": s["num_ooms"],
    }


def basics():
    props = torch.cuda.get_device_properties(0)
    step(
        "counted",
        available=torch.cuda.is_available(),
        count=torch.cuda.device_count(),
        name=props.name,
        total=props.total_memory,
        sms=props.multi_processor_count,
        cc=[props.major, props.minor],
        cuda=torch.version.cuda,
    )
    free, total = torch.cuda.mem_get_info()
    step("started", free=free, total=total)
    x = torch.empty(256 * MIB, dtype=torch.uint8, device="cuda")
    # Kernels of PyTorch's own: fill, elementwise, reduction.
    y = torch.zeros(4096, device="cuda")
    z = (y + 1) * 2
    z.sum()
    torch.cuda.synchronize()
    free, _ = torch.cuda.mem_get_info()
    step("allocated", ptr=x.data_ptr(), free=free, **stats())
    del x, y, z
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info()
    step("freed", free=free, **stats())


def limit():
    free, total = torch.cuda.mem_get_info()
    step("started", free=free, total=total)
    held = []
    error = ""
    try:
        while len(held) < 10_000:
            held.append(torch.empty(128 * MIB, dtype=torch.uint8, device="cuda"))
    except torch.cuda.OutOfMemoryError as e:
        error = str(e).splitlines()[0]
    free, total = torch.cuda.mem_get_info()
    step("full", chunks=len(held), error=error, free=free, total=total, **stats())
    del held
    torch.cuda.empty_cache()
    step("emptied", **stats())


{"basics": basics, "limit": limit}[sys.argv[1]]()
print("end", flush=True)
