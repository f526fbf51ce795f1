#!/usr/bin/env bash
# The GPU run of this artifact, for a lent machine with PyTorch and a CUDA GPU (no vLLM, no network needed).
#
#   benchmarks/gpu/run_device.sh [--tiny]        # writes into $OUT (default ./torch-device-out)
#
# 1. the torch backend's plan (dlfp.studies.torch_device): Qwen3-8B request list async, the Qwen3-0.6B
#    headline configuration, the 8B list sync; baseline / DLFP / DLFP-G: gpu.json, runs.csv, torch-traces.tar.gz;
# 2. one Qwen3 decoder layer at the shapes those runs hit (benchmarks/gpu/measure_layers.py --grid torch):
#    measure_layers.csv.
# About 6 minutes on an H200. --tiny rehearses both on the CPU (tiny model, fp32) in about a minute.
# The package is taken from artifact/ (PYTHONPATH); it needs numpy, pandas, pyarrow, pyyaml, pydantic and torch.
set -uo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
out=${OUT:-$PWD/torch-device-out}
tiny=()
layers=(--device cuda --grid torch --reps 10)
if [ "${1:-}" = "--tiny" ]; then
  tiny=(--tiny); layers=(--device cpu --tiny --reps 2)
fi
mkdir -p "$out"
export PYTHONPATH="$here/artifact${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
python3 -m dlfp.studies.torch_device --out "$out" "${tiny[@]}" --budget-s "${DLFP_DEVICE_BUDGET_S:-420}"
rc=$?
[ "$rc" -eq 2 ] && exit 2
timeout "${DLFP_LAYERS_TIMEOUT_S:-120}" python3 "$here/benchmarks/gpu/measure_layers.py" --out "$out" "${layers[@]}" \
  || echo "measure_layers did not finish (exit $?)"
exit "$rc"
