#!/usr/bin/env python3
"""Stand-in for the gpu bundle's torch_limits.py on the simulated node
(agent/tests/bundle_controller.rs): `saturate SECONDS [NAME]` keeps the GPU
busy with the simulator's C workload (`spin` kernels of one block per SM,
as a large matrix product fills the GPU, back to back, one
process for the whole run, as a PyTorch loop is) and prints, like the real
script, one JSON line per second of wall time with the kernels finished in
it, per second of wall time between the workload's reports (as
`mm_per_s`; a report follows the sync that drains its queue), then the mean over the second half
(`steady_mm_per_s`). Under the bundle's LD_PRELOAD the workload runs under
libtessera.so; $BUNDLE_WORKLOAD names the workload program."""
import json
import os
import subprocess
import sys
import time

if len(sys.argv) < 3 or sys.argv[1] != "saturate":
    sys.exit(__doc__)
seconds, name = int(float(sys.argv[2])), sys.argv[3] if len(sys.argv) > 3 else "workload"
ops = ["dev", "0"] + ["run", "spin", "100", "256", "1000"] * seconds
work = subprocess.Popen([os.environ["BUNDLE_WORKLOAD"], *ops], stdout=subprocess.PIPE, text=True)
per_second = []
last = time.perf_counter()
for line in work.stdout:
    if line.startswith("error"):
        sys.exit(f"{name}: the workload said {line.strip()}")
    if line.startswith("dev "):
        last = time.perf_counter()
    if line.startswith("run "):
        now = time.perf_counter()
        per_second.append(round(float(line.split()[1]) / (now - last), 1))
        last = now
        print(json.dumps({"name": name, "t": len(per_second), "mm_per_s": per_second[-1]}), flush=True)
if work.wait() != 0:
    sys.exit(f"{name}: the workload exited with {work.returncode}")
half = per_second[len(per_second) // 2:] or per_second
print(json.dumps({"name": name, "steady_mm_per_s": round(sum(half) / len(half), 1)}), flush=True)
