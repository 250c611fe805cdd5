"""A CuPy kernel loop, the CuPy counterpart of the C workload's `run`:
launches kernel NAME (GRID blocks of BLOCK threads, compiled by NVRTC)
back to back for MS milliseconds of wall time, then synchronises and
prints `run <launches>`. The simulated node gives the kernel its time by
name (`[cost.functions.<NAME>]`).

Usage: cupy_loop.py NAME GRID BLOCK MS
"""

import sys
import time

import cupy

name, grid, block, ms = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
kernel = cupy.RawKernel(
    'extern "C" __global__ void %s(float* p) { p[threadIdx.x] = 1; }' % name,
    name,
)
x = cupy.zeros(block, dtype=cupy.float32)
kernel((1,), (block,), (x,))  # compiled and loaded before the clock starts
cupy.cuda.Device().synchronize()
print("ready", flush=True)
end = time.monotonic() + ms / 1000
launches = 0
while time.monotonic() < end:
    kernel((grid,), (block,), (x,))
    launches += 1
cupy.cuda.Device().synchronize()
print("run", launches, flush=True)
