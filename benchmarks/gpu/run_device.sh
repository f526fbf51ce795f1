#!/usr/bin/env bash
# The GPU run of this artifact, for a lent machine with PyTorch and a CUDA GPU (no vLLM, no network needed).
#
#   benchmarks/gpu/run_device.sh [--tiny]        # writes into $OUT (default ./torch-device-out)
#
# 1. the torch backend's plan (dlfp.studies.torch_device): Qwen3-8B request list async, the Qwen3-0.6B
#    headline configuration, the 8B list sync; baseline / DLFP / DLFP-G: gpu.json, runs.csv, torch-traces.tar.gz;
# 2. what one iteration costs by batch shape and attention mode, host launch and device time
#    (benchmarks/gpu/step_costs.py): step_costs.csv;
# 3. one Qwen3 decoder layer at the shapes those runs hit (benchmarks/gpu/measure_layers.py --grid torch):
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
python3 -m dlfp.studies.torch_device --out "$out" ${tiny[@]+"${tiny[@]}"} --budget-s "${DLFP_DEVICE_BUDGET_S:-420}"
rc=$?
[ "$rc" -eq 2 ] && exit 2
[ -d "$out/traces" ] && python3 -m dlfp.studies.torch_device --out "$out" --pack  # after a killed run
timeout "${DLFP_STEPS_TIMEOUT_S:-120}" python3 "$here/benchmarks/gpu/step_costs.py" --out "$out" ${tiny[@]+"${tiny[@]}"} \
  || echo "step_costs did not finish (exit $?)"
timeout "${DLFP_LAYERS_TIMEOUT_S:-120}" python3 "$here/benchmarks/gpu/measure_layers.py" --out "$out" "${layers[@]}" \
  || echo "measure_layers did not finish (exit $?)"
exit "$rc"
