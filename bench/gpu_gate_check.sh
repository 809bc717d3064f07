#!/usr/bin/env bash
# One device call for what the device gate and the capture paths changed (kernels/device_gate.py,
# kernels/graph_capture.py, the engines' eager fallback) and no GPU has run yet: the capture tests, the
# engine's exactness with graphs on and off, then the two-session bench gated and ungated. Logs in $OUT, named
# without the card (a call may land on an H100): gpu_info.txt and the JSON's "device" say which.
#
#   run: bash bench/gpu_gate_check.sh      (the trained draft model moved out first: 64 MiB carry limit)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-bench/results}"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$OUT/gpu_info.txt"
python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_graph_capture.py tests/test_engine_gpu.py \
  2>&1 | tee "$OUT/gpu_tests_gate.log"
python3 bench/capture_beside_other_sessions.py --gate on,off --out "$OUT/capture_beside_other_sessions.json" \
  2>&1 | tee "$OUT/capture_beside_other_sessions.log"
