#!/usr/bin/env bash
# Set-up on a fresh machine: a local virtual environment with what ula needs, then ula itself (editable).
# torch==2.13.0 when none is importable in .venv, from pip's configured index (a CPU wheel on the CI machines, whose pip
# finds one on disk; PyPI's Linux wheel is the CUDA build); triton==3.6.0 (Linux only: Triton has no other wheels)
# runs the kernels' tests through its interpreter on machines without a GPU, and they are skipped without it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv"
  "$PY" -m venv .venv
fi
VPY="$PWD/.venv/bin/python"
# One pip call for all that is missing: one resolution (95 s, not 115, on a 2-core machine). pip's bytecode
# compile stays: with PYTHONDONTWRITEBYTECODE set, as on this project's machines, nothing else would write it and
# every process of the suite would compile torch from source again.
pipi() { "$VPY" -m pip install -q --disable-pip-version-check "$@"; }
missing=$("$VPY" - <<'PYEOF'
import importlib.util as u, platform
need = {"torch": "torch==2.13.0", "numpy": "numpy", "tqdm": "tqdm", "pytest": "pytest", "xdist": "pytest-xdist",
        "hypothesis": "hypothesis", "matplotlib": "matplotlib", "safetensors": "safetensors",
        "transformers": "transformers"}
if platform.system() == "Linux":
    need["triton"] = "triton==3.6.0"
print(" ".join(p for m, p in need.items() if u.find_spec(m) is None))
PYEOF
)
if [ "$(uname -s)" != Linux ]; then
  echo "[setup] no Triton wheel for $(uname -s): the kernels' tests will be skipped (ula runs on the PyTorch path)"
fi
if [ -n "$missing" ]; then
  echo "[setup] installing $missing"
  pipi $missing
fi
if ! (cd / && "$VPY" -c "import ula") 2>/dev/null; then  # from / so the source tree does not count
  echo "[setup] installing ula (editable)"
  pipi --no-deps --no-build-isolation -e . 2>/dev/null || pipi --no-deps -e .
fi
