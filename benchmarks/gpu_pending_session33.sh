#!/bin/bash
# Session 33's GPU call: the smoke, then the suite's GPU files, on the tree with the families' packed layout
# built once per cu_seqlens tensor (ula/ops/_common.py, PackedLayout.of) and test_train_cp's new parameter check.
# Run: OUT=... bash benchmarks/gpu_pending_session33.sh
set -u
L=$OUT/pending33.log
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  sha1sum ula/ops/_common.py ula/core/cu_cache.py; } > "$L" 2>&1
echo "### smoke" >> "$L"
timeout 420 python3 benchmarks/gpu_smoke.py >> "$L" 2>&1; echo "rc=$?" >> "$L"
echo "### ULA_TEST_GPU=1 suite" >> "$L"
ULA_TEST_GPU=1 timeout 320 python3 -m pytest -q -n 8 -p no:cacheprovider tests -rfE 2>&1 | tail -25 >> "$L"
tail -60 "$L"
