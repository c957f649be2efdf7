#!/bin/bash
# Next session's first GPU call (written in session 31, no device time left then): (1) the unexplained errors of
# decayed packed calls seen in session 31's call, on the tree as it stands; (2) packed layers, eager, with the
# cu_seqlens cache against the tree before it (build/prev, carried); (3) the smoke; (4) the suite's GPU files.
# Prepare: rm -rf build/prev && mkdir -p build/prev && git archive 1eff0ad | tar -x -C build/prev &&
#          cp benchmarks/gpu_packed_layers.py benchmarks/record.py build/prev/benchmarks/
# Run:     OUT=... bash benchmarks/gpu_pending_session32.sh   (carry build/prev)
set -u
L=$OUT/pending32.log
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  sha1sum ula/core/cu_cache.py ula/core/triton/chunk.py ula/core/triton/state.py; } > "$L" 2>&1
mkdir -p "$OUT/errors" "$OUT/new" "$OUT/prev"
echo "### packed, decayed ops' errors against float32 copies" >> "$L"
OUT=$OUT/errors timeout 150 python3 benchmarks/gpu_state_split.py --modes off --errors --shapes "16384+16384,8" \
  --ops linear,normalized,scalar,mlstm_exp,gla >> "$L" 2>&1; echo "rc=$?" >> "$L"
echo "### packed layers, this tree" >> "$L"
OUT=$OUT/new timeout 120 python3 benchmarks/gpu_packed_layers.py >> "$L" 2>&1; echo "rc=$?" >> "$L"
echo "### packed layers, the tree before the cache (1eff0ad)" >> "$L"
(cd build/prev && OUT=$OUT/prev timeout 120 python3 benchmarks/gpu_packed_layers.py) >> "$L" 2>&1; echo "rc=$?" >> "$L"
echo "### smoke" >> "$L"
timeout 120 python3 benchmarks/gpu_smoke.py >> "$L" 2>&1; echo "rc=$?" >> "$L"
echo "### ULA_TEST_GPU=1 suite" >> "$L"
ULA_TEST_GPU=1 timeout 150 python3 -m pytest -q -n 8 -p no:cacheprovider tests -rfE 2>&1 | tail -15 >> "$L"
tail -60 "$L"
