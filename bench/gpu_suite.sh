#!/usr/bin/env bash
# One device call: GPU tests (kernels at real shapes, engine exactness across backends and CUDA
# graphs), then the throughput benchmark. Results land in $OUT (device tool) or bench/results.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-bench/results}"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu_info.txt"
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" | tee -a "$OUT/gpu_info.txt"
if [ "${SKIP_TESTS:-0}" != "1" ]; then
  python3 -m pytest -q -x -m gpu -p no:cacheprovider ${GPU_TESTS:-tests/test_engine_gpu.py} 2>&1 | tee "$OUT/gpu_tests.log"
fi
python3 bench/throughput.py --device cuda --weights random --num-requests "${NREQ:-256}" --batch1 \
  --out "$OUT/throughput_cuda.json" 2>&1 | tee "$OUT/throughput_cuda.log"
