#!/usr/bin/env python3
"""Create, update and show a Tessera region directory without Rust.

The byte layout is the region ABI of `preload/region/src/layout.rs`
(version 1); this file is the bundle's stand-in for the node agent.

  tessera_region.py create DIR --gpu UUID [--memory MiB] [--overhead MiB]
                                          [--rate WARPS_PER_S] [--burst WARPS]
  tessera_region.py set    DIR --gpu UUID [...]     (publish new limits)
  tessera_region.py show   DIR                      (JSON)
"""
import argparse
import json
import mmap
import os
import struct
import sys

CONTROL_MAGIC = b"TSRCTL\x00\x01"
USAGE_MAGIC = b"TSRUSE\x00\x01"
ABI_VERSION = 1
CONTROL_SIZE = 4096
USAGE_SIZE = 73728
MAX_SLOTS = 256
UNLIMITED = 2**64 - 1
OFF_BUCKETS, OFF_OWNERS, OFF_USED = 64, 1088, 5184
OFF_EPOCH, OFF_BACKUP_EPOCH, OFF_BACKUP, OFF_BACKUP_GPUS = 24, 32, 1088, 1152


def parse_uuid(text):
    hexdigits = text.removeprefix("GPU-").replace("-", "")
    if not text.startswith("GPU-") or len(hexdigits) != 32:
        sys.exit(f"tessera_region: {text!r} is not a GPU UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)")
    try:
        return bytes.fromhex(hexdigits)
    except ValueError:
        sys.exit(f"tessera_region: {text!r} is not a GPU UUID (hex digits expected)")


def limits(args):
    mib = lambda v: UNLIMITED if v is None else v << 20
    rate = UNLIMITED if args.rate is None else args.rate
    burst = args.burst if args.burst is not None else (0 if rate == UNLIMITED else max(rate // 100, 1))
    uuid = parse_uuid(args.gpu)
    return struct.pack("<QQQQQQIIQ", int.from_bytes(uuid[:8], "little"), int.from_bytes(uuid[8:], "little"),
                       mib(args.memory), (args.overhead or 0) << 20, rate, burst, 0, 0, 0)


def publish(m, gpu_bytes):
    # Two copies (layout.rs): first the backup under an odd backup epoch,
    # then the primary under an odd epoch, so a reader always finds one of
    # them complete, even while this writer is stopped mid-write.
    epoch, backup = struct.unpack_from("<QQ", m, OFF_EPOCH)
    if epoch % 2 and backup and backup % 2 == 0:
        # A writer died in the primary: complete it from the backup first.
        m[16:24] = m[OFF_BACKUP:OFF_BACKUP + 8]
        m[64:OFF_BACKUP] = m[OFF_BACKUP_GPUS:OFF_BACKUP_GPUS + 1024]
        epoch += 1
        struct.pack_into("<Q", m, OFF_EPOCH, epoch)
    struct.pack_into("<Q", m, OFF_BACKUP_EPOCH, backup | 1)
    struct.pack_into("<II", m, OFF_BACKUP, 0, 1)
    m[OFF_BACKUP_GPUS:OFF_BACKUP_GPUS + 64] = gpu_bytes
    struct.pack_into("<Q", m, OFF_BACKUP_EPOCH, (backup | 1) + 1)
    struct.pack_into("<Q", m, OFF_EPOCH, epoch | 1)
    struct.pack_into("<II", m, 16, 0, 1)
    m[64:128] = gpu_bytes
    struct.pack_into("<Q", m, OFF_EPOCH, (epoch | 1) + 1)


def create(args):
    os.makedirs(args.dir, exist_ok=True)
    control = os.path.join(args.dir, "control")
    # A complete file under a temporary name, then renamed into place: a
    # crash leaves no half-written control, and processes that mapped an
    # older control file keep theirs.
    tmp = os.path.join(args.dir, f".control.tmp.{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(CONTROL_MAGIC + struct.pack("<II", ABI_VERSION, CONTROL_SIZE) + bytes(CONTROL_SIZE - 16))
    os.chmod(tmp, 0o644)
    with open(tmp, "r+b") as f:
        with mmap.mmap(f.fileno(), CONTROL_SIZE) as m:
            publish(m, limits(args))
        os.fsync(f.fileno())
    os.rename(tmp, control)
    usage = os.path.join(args.dir, "usage")
    if not os.path.exists(usage):
        with open(usage, "wb") as f:
            f.write(USAGE_MAGIC + struct.pack("<III", ABI_VERSION, USAGE_SIZE, MAX_SLOTS) + bytes(USAGE_SIZE - 20))
        os.chmod(usage, 0o666)
    print(f"created {args.dir}")


def update(args):
    with open(os.path.join(args.dir, "control"), "r+b") as f, mmap.mmap(f.fileno(), CONTROL_SIZE) as m:
        if m[:8] != CONTROL_MAGIC:
            sys.exit(f"tessera_region: {args.dir}/control is not a version-1 control region")
        publish(m, limits(args))
    print(f"updated {args.dir}")


def show(args):
    c = open(os.path.join(args.dir, "control"), "rb").read()
    u = open(os.path.join(args.dir, "usage"), "rb").read()
    if c[:8] != CONTROL_MAGIC or u[:8] != USAGE_MAGIC:
        sys.exit(f"tessera_region: {args.dir} does not hold version-1 regions")
    lo, hi, mem, overhead, rate, burst = struct.unpack_from("<QQQQQQ", c, 64)
    uuid = (lo.to_bytes(8, "little") + hi.to_bytes(8, "little")).hex()
    tat, epoch, launches, warps, throttled = struct.unpack_from("<QQQQQ", u, OFF_BUCKETS)
    used = sum(struct.unpack_from("<Q", u, OFF_USED + 8 * i)[0] for i in range(MAX_SLOTS))
    # Owner word: generation << 40 | state << 32 | pid.
    procs = [struct.unpack_from("<Q", u, OFF_OWNERS + 8 * i)[0] & 0xffffffff for i in range(MAX_SLOTS)
             if (struct.unpack_from("<Q", u, OFF_OWNERS + 8 * i)[0] >> 32) & 0xff]
    fmt = lambda v: "unlimited" if v == UNLIMITED else v
    print(json.dumps({
        "uuid": f"GPU-{uuid[:8]}-{uuid[8:12]}-{uuid[12:16]}-{uuid[16:20]}-{uuid[20:]}",
        "memory_limit": fmt(mem), "context_overhead": overhead, "launch_rate": fmt(rate), "launch_burst": burst,
        "used": used, "launches": launches, "warps": warps, "throttled_ns": throttled, "pids": procs,
    }, indent=2))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("create", "set"):
        s = sub.add_parser(name)
        s.add_argument("dir")
        s.add_argument("--gpu", required=True, help="GPU UUID (GPU-...)")
        s.add_argument("--memory", type=int, help="memory limit in MiB (default: unlimited)")
        s.add_argument("--overhead", type=int, help="memory charged per CUDA context, MiB (default 0)")
        s.add_argument("--rate", type=int, help="launch rate in warps/s (default: unlimited; 0 pauses)")
        s.add_argument("--burst", type=int, help="launch burst in warps (default: rate/100)")
    s = sub.add_parser("show")
    s.add_argument("dir")
    args = p.parse_args()
    {"create": create, "set": update, "show": show}[args.cmd](args)


if __name__ == "__main__":
    main()
