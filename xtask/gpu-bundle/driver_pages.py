#!/usr/bin/env python3
"""What the CUDA driver really holds for cuMemAlloc, per size class, next
to what Tessera's model says (the simulator's and libtessera.so's).

  driver_pages.py measure        without libtessera.so: per size class,
                                 allocate with cuMemAlloc_v2 (ctypes on
                                 libcuda.so.1), read the pointer spacing and
                                 the device memory used (cuMemGetInfo_v2),
                                 then thin and free; prints the driver's
                                 figures beside the model's
  driver_pages.py limit MIB      under libtessera.so with a limit of MIB
                                 (context included): per size class,
                                 allocate until CUDA_ERROR_OUT_OF_MEMORY and
                                 print what was allocated and what the
                                 device really holds (nvidia-smi, which runs
                                 without the library)

The model (xtask/gpusim/cuda/src/heap.rs, preload/src/pages.rs): a request
of at most half a page (1 MiB on 2 MiB pages) is rounded to 512 bytes and
packed into shared pages; a larger one starts on a page boundary and holds
whole pages; a page is held while any allocation lives in it. libtessera.so
charges the distinct pages the returned pointers touch.
"""
import ctypes
import os
import statistics
import subprocess
import sys

MIB = 1 << 20
SIZES = [512, 1000, 4096, 65536, 777777, MIB, MIB + 1, 3 * MIB // 2, 2 * MIB,
         3 * MIB + 5, 7 * MIB, 64 * MIB]
# Each size class is measured over about this many pages of the model.
PAGES = int(os.environ.get("PAGES", "64"))


class Prop(ctypes.Structure):
    """CUmemAllocationProp (cuda.h)."""
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int),
                ("locType", ctypes.c_int), ("locId", ctypes.c_int),
                ("win32HandleMetaData", ctypes.c_void_p),
                ("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class Driver:
    def __init__(self, device=0):
        self.cu = ctypes.CDLL("libcuda.so.1")
        self.check("cuInit", self.cu.cuInit(0))
        dev = ctypes.c_int()
        self.check("cuDeviceGet", self.cu.cuDeviceGet(ctypes.byref(dev), device))
        ctx = ctypes.c_void_p()
        self.check("cuDevicePrimaryCtxRetain",
                   self.cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev))
        self.check("cuCtxSetCurrent", self.cu.cuCtxSetCurrent(ctx))
        self.cu.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
        self.cu.cuMemFree_v2.argtypes = [ctypes.c_uint64]
        prop = Prop(type=1, locType=1, locId=device)
        g = ctypes.c_size_t()
        rc = self.cu.cuMemGetAllocationGranularity(ctypes.byref(g), ctypes.byref(prop), 0)
        self.page = g.value if rc == 0 and g.value else 2 * MIB

    @staticmethod
    def check(what, rc):
        if rc != 0:
            sys.exit(f"{what} failed: CUresult {rc}")

    def alloc(self, size):
        p = ctypes.c_uint64()
        rc = self.cu.cuMemAlloc_v2(ctypes.byref(p), size)
        return p.value if rc == 0 else None, rc

    def free(self, p):
        self.check("cuMemFree_v2", self.cu.cuMemFree_v2(p))

    def used(self):
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        self.check("cuMemGetInfo_v2",
                   self.cu.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)))
        return total.value - free.value


def model_fits(size, pages, page):
    """Allocations of `size` the model fits in `pages` pages."""
    if size <= page // 2:
        return pages * (page // (-(-size // 512) * 512))
    return pages // -(-size // page)


def pointer_pages(ptrs, size, page):
    """Bytes libtessera.so charges: distinct pages the footprints touch."""
    touched = set()
    for p in ptrs:
        start = p // 512 * 512
        end = -(-(p + size) // 512) * 512
        touched.update(range(start // page, (end - 1) // page + 1))
    return len(touched) * page


def mib(b):
    return f"{b / MIB:9.2f}"


def measure():
    d = Driver()
    page = d.page
    print(f"page (cuMemGetAllocationGranularity, minimum): {page} bytes")
    print("size        allocs   median step   driver MiB  libtessera MiB  model MiB"
          "   thinned: driver  libtessera   freed: driver")
    for size in SIZES:
        n = max(2, model_fits(size, PAGES, page))
        base = d.used()
        ptrs = []
        for _ in range(n):
            p, rc = d.alloc(size)
            if p is None:
                print(f"{size:<10}  stopped at {len(ptrs)}: CUresult {rc}")
                break
            ptrs.append(p)
        held = d.used() - base
        steps = [b - a for a, b in zip(ptrs, ptrs[1:])]
        step = f"{int(statistics.median(steps))}" if steps else "-"
        charged = pointer_pages(ptrs, size, page)
        model = PAGES * page if n == model_fits(size, PAGES, page) else None
        # Keep one allocation per page (the lowest), free the rest.
        keep, seen = [], set()
        for p in sorted(ptrs):
            if p // page not in seen:
                seen.add(p // page)
                keep.append(p)
            else:
                d.free(p)
        thinned = d.used() - base
        thin_charged = pointer_pages(keep, size, page)
        for p in keep:
            d.free(p)
        freed = d.used() - base
        print(f"{size:<10} {len(ptrs):7}  {step:>13}  {mib(held)}  {mib(charged)}     "
              f"{mib(model) if model is not None else '        -'}   "
              f"{mib(thinned)}  {mib(thin_charged)}   {mib(freed)}")
        print(f"class {size} {len(ptrs)} {held} {charged} {model if model is not None else -1} "
              f"{thinned} {thin_charged} {freed}")
    # Does a small allocation land in the tail of a large one's last page?
    big, _ = d.alloc(7 * MIB)
    small, _ = d.alloc(512 * 1024)
    print(f"7 MiB at {big:#x}, then 512 KiB at {small:#x}: "
          f"{'in the 7 MiB tail page' if small // page == (big + 7 * MIB) // page else 'elsewhere'}")
    d.free(small)
    d.free(big)
    print("driver MiB: cuMemGetInfo used delta; libtessera MiB: pages the pointers touch"
          " (what it charges); model MiB: what the simulator holds")


def smi_used():
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                          "-i", "0"], capture_output=True, text=True, env=env, check=True)
    return int(out.stdout.split()[0]) * MIB


def limit(limit_mib):
    before = smi_used()
    d = Driver()
    with_ctx = smi_used()
    print(f"limit {limit_mib} MiB; the context holds {mib(with_ctx - before)} MiB (nvidia-smi)")
    print("size        allocs  requested MiB  device holds MiB (nvidia-smi, context included)")
    for size in SIZES:
        ptrs = []
        while True:
            p, rc = d.alloc(size)
            if p is None:
                break
            ptrs.append(p)
        held = smi_used() - before
        over = "  OVER THE LIMIT" if held > limit_mib * MIB else ""
        print(f"{size:<10} {len(ptrs):7}  {mib(len(ptrs) * size)}      {mib(held)}"
              f"  (stopped: CUresult {rc}){over}")
        for p in ptrs:
            d.free(p)


if __name__ == "__main__":
    if sys.argv[1:2] == ["measure"]:
        measure()
    elif len(sys.argv) == 3 and sys.argv[1] == "limit":
        limit(int(sys.argv[2]))
    else:
        sys.exit(__doc__)
