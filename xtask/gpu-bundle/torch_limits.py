#!/usr/bin/env python3
"""What a PyTorch program sees under libtessera.so.

  torch_limits.py memory          mem_get_info, then allocate 256 MiB
                                  tensors until PyTorch reports OOM
  torch_limits.py rate SECONDS    launch small kernels for SECONDS and
                                  report kernels per second
"""
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


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "memory":
        memory()
    elif len(sys.argv) >= 3 and sys.argv[1] == "rate":
        rate(float(sys.argv[2]))
    else:
        sys.exit(__doc__)
