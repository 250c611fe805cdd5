#!/usr/bin/env python3
"""What a PyTorch program sees under libtessera.so.

  torch_limits.py memory          mem_get_info, then allocate 256 MiB
                                  tensors until PyTorch reports OOM
  torch_limits.py rate SECONDS    launch small kernels for SECONDS and
                                  report kernels per second
  torch_limits.py saturate SECONDS [NAME]
                                  keep the GPU busy with matrix products
                                  for SECONDS; print products per second
                                  per second of wall time (one JSON line
                                  each), then the mean over the second half
"""
import json
import sys
import time

import torch


def memory():
    free, total = torch.cuda.mem_get_info()
    print(f"mem_get_info: total {total >> 20} MiB, free {free >> 20} MiB")
    chunks = []
    try:
        while True:
            chunks.append(torch.empty(256 << 20, dtype=torch.uint8, device="cuda"))
    except torch.cuda.OutOfMemoryError as e:
        print(f"allocated {len(chunks) * 256} MiB in 256 MiB tensors, then OutOfMemoryError")
        print(f"  ({str(e).splitlines()[0][:160]})")
    free, total = torch.cuda.mem_get_info()
    print(f"mem_get_info at the limit: total {total >> 20} MiB, free {free >> 20} MiB")


def rate(seconds):
    x = torch.ones(64, 64, device="cuda")
    torch.cuda.synchronize()
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(100):
            x.mul_(1.0)
        n += 100
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    print(f"kernels/s {n / elapsed:.0f} ({n} kernels in {elapsed:.2f} s)")


def saturate(seconds, name):
    # 2048x2048 fp32 products: a few ms each on any data-centre GPU, so the
    # launch rate, not the queue, decides how many run.
    a = torch.randn(2048, 2048, device="cuda")
    b = torch.randn(2048, 2048, device="cuda")
    torch.cuda.synchronize()
    start = time.perf_counter()
    per_second = []
    while time.perf_counter() - start < seconds:
        t0, n = time.perf_counter(), 0
        while time.perf_counter() - t0 < 1.0:
            for _ in range(4):
                torch.mm(a, b)
            torch.cuda.synchronize()
            n += 4
        rate = n / (time.perf_counter() - t0)
        per_second.append(rate)
        print(json.dumps({"name": name, "t": round(time.perf_counter() - start, 1), "mm_per_s": round(rate, 1)}), flush=True)
    half = per_second[len(per_second) // 2:] or per_second
    print(json.dumps({"name": name, "steady_mm_per_s": round(sum(half) / len(half), 1)}), flush=True)


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "memory":
        memory()
    elif len(sys.argv) >= 3 and sys.argv[1] == "rate":
        rate(float(sys.argv[2]))
    elif len(sys.argv) >= 3 and sys.argv[1] == "saturate":
        saturate(float(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else "workload")
    else:
        sys.exit(__doc__)
