#!/usr/bin/env bash
# Everything parsl-torch owes a GPU machine, in one command, most telling first, each step under its
# own time limit so that a short lease still brings back what ran:
#   bash benchmarks/gpu_check.sh [LOGDIR]        (from the project root; `make gpu-check` does the same)
# 1 doctor (device, backend, a live all_reduce on one rank per GPU)   2 the tests marked gpu
# 3 the main job (`make demo`'s command, fresh)                       4 bench_gpu (stage vs loop, MFU)
# Each step's output goes to LOGDIR/<step>.log (default: $OUT where set, else gpu-check/); the summary,
# a line per step with its exit status and seconds, to LOGDIR/summary.txt and the terminal.
# GPU_CHECK_BENCH overrides bench_gpu's arguments (default: both models, 2 repeats).
set -uo pipefail
logs=${1:-${OUT:-gpu-check}}
mkdir -p "$logs"
summary="$logs/summary.txt"
: > "$summary"

step() {  # step NAME SECONDS COMMAND...: runs it, its output to NAME.log, a line to the summary
    local name=$1 limit=$2; shift 2
    local t0=$SECONDS rc=0
    timeout --signal=TERM --kill-after=10 "$limit" "$@" > "$logs/$name.log" 2>&1 || rc=$?
    local result=ok
    if [ "$rc" = 124 ]; then result="timed out after ${limit}s"; elif [ "$rc" != 0 ]; then result=FAILED; fi
    printf '%-8s rc=%-3s %4ss  %s\n' "$name" "$rc" "$((SECONDS - t0))" "$result" | tee -a "$summary"
}

{ date -u; hostname; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | head -5
  python3 -c 'import torch, parsl_torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
"gpus", torch.cuda.device_count()); print("parsl-torch", parsl_torch.__version__)'; } > "$logs/machine.txt" 2>&1
cat "$logs/machine.txt"
step doctor 60 parsl-torch doctor
step tests 180 python3 -m pytest -m gpu tests -q -p no:cacheprovider
step demo 150 parsl-torch run workflows/train_eval.py --run-dir "$logs/demo-run" --fresh
# shellcheck disable=SC2086  # (the arguments are meant to split)
step bench 360 python3 benchmarks/bench_gpu.py ${GPU_CHECK_BENCH:---models big,small --repeats 2}
tail -n 20 "$logs/bench.log"
if ! python3 -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
    echo "no CUDA GPU here: the gpu tests were skipped, so this run checked the script, not a GPU" | tee -a "$summary"
fi
! grep -qv ' ok$' "$summary"
