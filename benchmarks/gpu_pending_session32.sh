#!/bin/bash
# Next session's first GPU calls (written in session 31, when no device time was left).
# Part 1 (one call, ~6 min): the errors of decayed packed calls that session 31's call could not explain, on the
#   tree as it stands; packed layers, eager, with the cu_seqlens cache against the tree before it (build/prev).
# Part 2 (one call, ~5 min): the smoke, then the suite's GPU files (tests/test_gpu_host_waits.py is new).
# Prepare: rm -rf build/prev && mkdir -p build/prev && git archive 1eff0ad | tar -x -C build/prev &&
#          cp benchmarks/gpu_packed_layers.py benchmarks/record.py build/prev/benchmarks/
# Run:     OUT=... bash benchmarks/gpu_pending_session32.sh 1   (carry build/prev);  ... 2
set -u
PART=${1:?part 1 or 2}
L=$OUT/pending32_part$PART.log
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  sha1sum ula/core/cu_cache.py ula/core/triton/chunk.py ula/core/triton/state.py; } > "$L" 2>&1
if [ "$PART" = 1 ]; then
  mkdir -p "$OUT/errors" "$OUT/new" "$OUT/prev"
  echo "### packed, decayed ops' errors against float32 copies" >> "$L"
  OUT=$OUT/errors timeout 150 python3 benchmarks/gpu_state_split.py --modes off --errors --shapes "16384+16384,8" \
    --ops linear,normalized,scalar,mlstm_exp,gla >> "$L" 2>&1; echo "rc=$?" >> "$L"
  echo "### packed layers, this tree" >> "$L"
  OUT=$OUT/new timeout 200 python3 benchmarks/gpu_packed_layers.py >> "$L" 2>&1; echo "rc=$?" >> "$L"
  echo "### packed layers, the tree before the cache (1eff0ad)" >> "$L"
  (cd build/prev && OUT=$OUT/prev timeout 200 python3 benchmarks/gpu_packed_layers.py) >> "$L" 2>&1
  echo "rc=$?" >> "$L"
else
  echo "### smoke" >> "$L"
  timeout 240 python3 benchmarks/gpu_smoke.py >> "$L" 2>&1; echo "rc=$?" >> "$L"
  echo "### ULA_TEST_GPU=1 suite" >> "$L"
  ULA_TEST_GPU=1 timeout 300 python3 -m pytest -q -n 8 -p no:cacheprovider tests -rfE 2>&1 | tail -25 >> "$L"
fi
tail -60 "$L"
