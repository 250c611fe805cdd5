"""CuPy on the simulated node, in steps the Rust test checks against the
simulator's record (xtask/gpusim/tests/cuda_runtimes.rs).

Usage: cupy_steps.py basics|kernels|limit|pool_trim

Each step prints one line, `step <name> <json>`, then waits for a line on
stdin, so the test can read the node's state while the process holds what
the step allocated. Device memory holds no data on the simulator: values
read back are not checked, only that every call succeeds.
"""

import json
import sys

import cupy

MIB = 1 << 20
runtime = cupy.cuda.runtime


def step(step_name, **values):
    print("step", step_name, json.dumps(values), flush=True)
    sys.stdin.readline()


def basics():
    # Counting devices and reading their properties makes no context.
    props = runtime.getDeviceProperties(0)
    step(
        "counted",
        count=runtime.getDeviceCount(),
        name=props["name"].decode(),
        total_global=props["totalGlobalMem"],
        sms=props["multiProcessorCount"],
        cc=[props["major"], props["minor"]],
    )
    free, total = runtime.memGetInfo()
    step("started", free=free, total=total)
    a = cupy.zeros(256 * MIB, dtype=cupy.uint8)
    free, _ = runtime.memGetInfo()
    step("allocated", ptr=a.data.ptr, free=free)
    del a
    cupy.get_default_memory_pool().free_all_blocks()
    free, _ = runtime.memGetInfo()
    step("freed", free=free)


def kernels():
    # Elementwise and reduction kernels of CuPy's own, compiled by NVRTC.
    y = cupy.arange(10) * 2
    total = int(y.sum())
    slow = cupy.ElementwiseKernel("float32 a", "float32 b", "b = a * 3", "tessera_slow")
    raw = cupy.RawKernel(
        r'extern "C" __global__ void tessera_raw(float* p) { p[threadIdx.x] = 1; }',
        "tessera_raw",
    )
    red = cupy.ReductionKernel("float32 x", "float32 y", "x", "a + b", "y = a", "0", "tessera_sum")
    x = cupy.ones(1024, dtype=cupy.float32)
    slow(x)  # compiles and loads it
    raw((4,), (64,), (x,))
    red(x)
    # A stream and two events around the kernel the node makes slow.
    stream = cupy.cuda.Stream(non_blocking=True)
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    with stream:
        start.record()
        slow(x)
        end.record()
    stream.synchronize()
    slow_ms = cupy.cuda.get_elapsed_time(start, end)
    # cudaMallocAsync through CuPy's MemoryAsyncPool.
    default = cupy.get_default_memory_pool()
    cupy.cuda.set_allocator(cupy.cuda.MemoryAsyncPool().malloc)
    b = cupy.empty(64 * MIB, dtype=cupy.uint8)
    step("async", ptr=b.data.ptr)
    del b
    cupy.cuda.set_allocator(default.malloc)
    # A CUDA graph captured from a stream, then launched.
    g_stream = cupy.cuda.Stream(non_blocking=True)
    with g_stream:
        g_stream.begin_capture()
        z = x * 5
        graph = g_stream.end_capture()
    graph.launch(stream=g_stream)
    g_stream.synchronize()
    cupy.cuda.Device().synchronize()
    step("done", sum=total, slow_ms=slow_ms, graph_shape=list(z.shape))
    # A capture forked onto a second stream by an event and joined back:
    # the graph holds the kernels of both streams.
    s1 = cupy.cuda.Stream(non_blocking=True)
    s2 = cupy.cuda.Stream(non_blocking=True)
    e1, e2 = cupy.cuda.Event(), cupy.cuda.Event()
    with s1:
        s1.begin_capture()
        u = x * 7
        e1.record(s1)
        s2.wait_event(e1)
        with s2:
            v = x * 11
            e2.record(s2)
        s1.wait_event(e2)
        forked = s1.end_capture()
    step("forked", capturing=[s1.is_capturing(), s2.is_capturing()])
    forked.launch(stream=s1)
    s1.synchronize()
    attrs = runtime.pointerGetAttributes(u.data.ptr)
    # A host function captured after a kernel runs at each launch.
    calls = []
    h = cupy.cuda.Stream(non_blocking=True)
    with h:
        h.begin_capture()
        slow(x)
        h.launch_host_func(calls.append, 1)
        hosted = h.end_capture()
    hosted.launch(stream=h)
    hosted.launch(stream=h)
    h.synchronize()
    dot = hosted.debug_dot_str()
    step(
        "launched",
        type=attrs.type,
        device=attrs.device,
        shape=list(v.shape),
        host_calls=len(calls),
        dot_names_kernel="tessera_slow" in dot,
    )


def fill(chunk):
    held = []
    try:
        while len(held) < 10_000:
            held.append(cupy.empty(chunk, dtype=cupy.uint8))
    except cupy.cuda.memory.OutOfMemoryError:
        pass
    return held


def limit():
    free, total = runtime.memGetInfo()
    step("started", free=free, total=total)
    pool = cupy.get_default_memory_pool()
    held = fill(128 * MIB)
    free, _ = runtime.memGetInfo()
    step("full", chunks=len(held), pool=pool.total_bytes(), free=free)
    del held
    pool.free_all_blocks()
    cupy.cuda.set_allocator(cupy.cuda.MemoryAsyncPool().malloc)
    held = fill(128 * MIB)
    step("async_full", chunks=len(held))
    del held


def pool_trim():
    # MemoryAsyncPool keeps freed memory cached; when the device cannot
    # hold a new allocation beside the cache, the pool gives it back.
    pool = cupy.cuda.MemoryAsyncPool()
    _, total = runtime.memGetInfo()
    big = pool.malloc(int(0.7 * total))
    step("big", ptr=big.ptr)
    del big
    step("cached")
    small = pool.malloc(int(0.4 * total))
    step("small", ptr=small.ptr)
    del small


{"basics": basics, "kernels": kernels, "limit": limit, "pool_trim": pool_trim}[sys.argv[1]]()
print("end", flush=True)
