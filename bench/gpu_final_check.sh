#!/usr/bin/env bash
# The whole GPU side of the project in two device calls (each under the 10-minute limit), at one commit:
#
#   engine part: the kernel benchmarks (the decode ratio's spread over repeats among them) and throughput alone
#                on the GPU, then every GPU test that needs no app wheels, in two pytest processes side by side
#                (correctness tests; nothing there times against a goal). Carries the working tree only, the
#                trained draft model included (44 MB).
#       run: bash bench/gpu_final_check.sh engine
#   app part:    the app's GPU tests and constrained decoding (llguidance), with the wheels carried; the draft
#                model moved out first (wheels + tree would pass the 64 MiB carry limit).
#       run (carry [".whl"]): bash bench/gpu_final_check.sh app
#
# Logs and JSON land in $OUT (at most 8 files come back per call).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-bench/results}"
export PYTHONUNBUFFERED=1
PYTEST="python3 -m pytest -q -m gpu -p no:cacheprovider"

case "${1:-}" in
  engine)
    { nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem --format=csv
      python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)"
    } 2>&1 | tee "$OUT/gpu_info.txt"
    # File names in $OUT say nothing of the card (a call may land on an H100 or an H200): gpu_info.txt and each
    # JSON's GPU field do. Copy them into bench/results/ with the card in the name.
    timeout 150 python3 bench/kernels.py --out "$OUT/kernels.json" 2>&1 | tee "$OUT/kernels.log"
    # The decode ratio's spread over repeats on this machine (the same inputs, ABBA order), into the same log.
    timeout 90 python3 bench/paged_decode_spread.py --repeats 6 --out "$OUT/paged_decode_spread.json" 2>&1 \
      | tee -a "$OUT/kernels.log"
    timeout 150 python3 bench/throughput.py --device cuda --weights random --num-requests 256 --batch1 \
      --out "$OUT/throughput_cuda.json" 2>&1 | tee "$OUT/throughput_cuda.log"
    timeout 330 $PYTEST tests/test_engine_gpu.py tests/test_graph_capture.py tests/test_kernels.py tests/test_gemv.py \
      tests/test_parallel.py tests/test_scaling_gpu.py tests/test_pass_timing.py > "$OUT/gpu_tests_engine.log" 2>&1 &
    timeout 330 $PYTEST tests/test_fused_kernels.py tests/test_quant_decode_kernel.py tests/test_lora_kernels.py \
      tests/test_lora_gpu.py tests/test_kv_compression_gpu.py tests/test_serving_load_gpu.py \
      tests/test_disaggregated_gpu.py > "$OUT/gpu_tests_features.log" 2>&1 &
    wait
    tail -n 4 "$OUT/gpu_tests_engine.log" "$OUT/gpu_tests_features.log"
    ;;
  app)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
      && export PYTHONPATH=/tmp/site || exit 1
    nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/gpu_info_app.txt"
    timeout 480 $PYTEST tests/test_app_gpu.py tests/test_pages_gpu.py > "$OUT/gpu_tests_app.log" 2>&1 &
    timeout 480 $PYTEST tests/test_constrained_gpu.py > "$OUT/gpu_tests_constrained.log" 2>&1 &
    wait
    tail -n 4 "$OUT/gpu_tests_app.log" "$OUT/gpu_tests_constrained.log"
    ;;
  *) echo "usage: $0 engine|app" >&2; exit 2 ;;
esac
