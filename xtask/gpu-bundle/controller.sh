#!/bin/sh
# The agent's compute controller on a real GPU: `tessera-agent run` on real
# NVML, PyTorch workloads in containers at SM targets, and the shares they
# achieve. Needs python3 with torch, nvidia-smi; no Rust, no root.
#
#   ./controller.sh                       GPU 0: hard 30/50/20, then elastic 30/20
#   TARGETS="40 60" SECONDS_PER_RUN=30 ./controller.sh
#
# Two independent measures of each share: NVML's per-process SM samples as
# the agent reads them (`/containers`), and each workload's own throughput
# (matrix products per second) divided by the same workload's throughput
# alone on the GPU without libtessera.so.
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
TARGETS=${TARGETS:-30 50 20}
ELASTIC_TARGETS=${ELASTIC_TARGETS:-30 20}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-24}
PORT=${PORT:-19400}
OUT=${OUT:-$(mktemp -d)}
GPU=${GPU_UUID:-$(nvidia-smi --query-gpu=uuid --format=csv,noheader -i 0 | tr -d ' ')}
AGENT="$HERE/tessera-agent"
mkdir -p "$OUT"
export TESSERA_ROOT="$OUT/containers"

steady() { python3 -c 'import json,sys
for l in open(sys.argv[1]):
    d = json.loads(l)
    if "steady_mm_per_s" in d: print(d["steady_mm_per_s"])' "$1"; }

echo "== baseline: one workload alone, no libtessera.so"
python3 "$HERE/torch_limits.py" saturate "$SECONDS_PER_RUN" solo > "$OUT/solo.jsonl"
SOLO=$(steady "$OUT/solo.jsonl")
echo "solo: $SOLO products/s"

"$AGENT" run --listen "127.0.0.1:$PORT" 2> "$OUT/agent.log" &
AGENT_PID=$!
trap 'kill $AGENT_PID 2>/dev/null || true' EXIT
i=0
until curl -sf "127.0.0.1:$PORT/readyz" > /dev/null; do
    i=$((i + 1)); [ $i -lt 50 ] || { cat "$OUT/agent.log"; exit 1; }; sleep 0.2
done

# run MODE TARGET...: one container per target on $GPU, a workload in each,
# the agent's view sampled every second; prints target vs achieved.
run() {
    mode=$1; shift
    echo "== $mode: targets $*"
    names=""
    n=0
    for t in "$@"; do
        n=$((n + 1)); name="$mode$n"; names="$names $name"
        "$AGENT" container add --id "$name" --gpu "$GPU" --sm-target "$t" --mode "$mode" > /dev/null
        echo "$t" > "$OUT/$name.target"
    done
    pids=""
    for name in $names; do
        TESSERA_REGION_DIR="$TESSERA_ROOT/$name" LD_PRELOAD="$HERE/libtessera.so" \
            python3 "$HERE/torch_limits.py" saturate "$SECONDS_PER_RUN" "$name" > "$OUT/$name.jsonl" &
        pids="$pids $!"
    done
    s=0
    mkdir -p "$OUT/$mode.views"
    while [ $s -lt "$SECONDS_PER_RUN" ]; do
        sleep 1; s=$((s + 1))
        curl -sf "127.0.0.1:$PORT/containers" > "$OUT/$mode.views/$(printf %04d $s).json" || true
    done
    # The workloads only (the agent runs in the background too).
    wait $pids
    python3 - "$OUT" "$mode" "$SOLO" $names <<'PY'
import glob, json, sys
out, mode, solo, names = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4:]
views = []
for f in sorted(glob.glob(f"{out}/{mode}.views/*.json")):
    try:
        views.append(json.load(open(f)))
    except ValueError:
        pass
half = views[len(views) // 2:]
busy = [d["sm_percent"] for v in half for d in v.get("devices", []) if d.get("sm_percent") is not None]
print(f"{'container':<10} {'target %':>8} {'NVML SM % (agent)':>18} {'throughput share %':>19} {'launch rate':>12}")
for name in names:
    target = float(open(f"{out}/{name}.target").read())
    sm, rates = [], []
    for v in half:
        for c in v["containers"]:
            if c["id"] == name and c["gpus"]:
                g = c["gpus"][0]
                if g.get("sm_percent") is not None:
                    sm.append(g["sm_percent"])
                rates.append(g.get("launch_rate"))
    steady = [json.loads(l) for l in open(f"{out}/{name}.jsonl") if "steady_mm_per_s" in l]
    share = 100 * steady[-1]["steady_mm_per_s"] / solo if steady and solo > 0 else float("nan")
    mean = sum(sm) / len(sm) if sm else float("nan")
    print(f"{name:<10} {target:>8.0f} {mean:>18.1f} {share:>19.1f} {str(rates[-1] if rates else None):>12}")
    per_view = [g.get("sm_percent") for v in views for c in v["containers"] if c["id"] == name and c["gpus"] for g in c["gpus"][:1]]
    per_second = [d["mm_per_s"] for d in map(json.loads, open(f"{out}/{name}.jsonl")) if "mm_per_s" in d]
    print(f"  {name}: NVML SM % by view {per_view}; products/s by second {per_second}")
if busy:
    print(f"GPU busy (NVML, second half): {sum(busy) / len(busy):.1f} %")
PY
    for name in $names; do "$AGENT" container rm --id "$name" > /dev/null; done
}

run hard $TARGETS
run elastic $ELASTIC_TARGETS
echo "agent log and views in $OUT"
