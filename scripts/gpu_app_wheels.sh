#!/usr/bin/env bash
# Wheels for running the app's pages on a GPU machine that cannot reach a package index: Streamlit,
# Plotly and llguidance (constrained decoding) at the versions requirements.txt pins, plus those of
# their dependencies a CUDA image with PyTorch, pandas, pyarrow, numpy, jinja2 and attrs lacks (about
# 25 MB in all, llguidance 3 MB of it; with every dependency it would be several times that). Not
# pydeck (11 MB): no page draws a map, Streamlit imports it only for one, and the device tool carries
# at most 64 MiB with the working tree (33 MB of it now).
# Downloaded here, copied there, installed there with
#
#   python3 -m pip install --no-index --no-deps --target /tmp/site DIR/*.whl
#   PYTHONPATH=/tmp/site python3 -m pytest -m gpu tests/test_app_gpu.py
#
# Usage: bash scripts/gpu_app_wheels.sh [DIR (default .whl)] [the GPU machine's Python (default 3.12)]
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-.whl}"
py="${2:-3.12}"
pins=$(grep -E '^(streamlit|plotly)==' requirements.txt | sed 's/[[:space:]].*//')
# Streamlit's and Altair's dependencies that such an image does not have, at the versions tested together.
extra="altair==6.3.0 starlette==1.10.0 uvicorn==0.54.0 python-multipart==0.0.34 websockets==17.4
itsdangerous==2.2.0 watchdog==7.1.0 jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0
rpds-py==0.30.0"
# shellcheck disable=SC2086  # the version lists split into arguments on purpose
python3 -m pip download --no-deps --only-binary=:all: --python-version "$py" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$dir" $pins $extra
# llguidance has one wheel per platform for every Python >= 3.9 (abi3), built for glibc 2.31+: the
# platforms above do not take it, so it gets its own line rather than widening the one above.
llguidance=$(grep -E '^llguidance==' requirements.txt | sed 's/[[:space:]].*//')
python3 -m pip download --no-deps --only-binary=:all: --python-version "$py" --implementation cp \
    --platform manylinux_2_31_x86_64 -d "$dir" "$llguidance"
