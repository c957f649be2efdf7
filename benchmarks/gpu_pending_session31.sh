#!/bin/bash
# Session 31's GPU call: the state kernel's split of packed sequences (cu_seqlens) against no split, with errors
# against float32 copies; the same-call check that the generalized join leaves unpacked calls' time as it was (the
# tree before, 074a8e5, carried as build/prev); the GPU smoke; the suite's GPU files on the compiled kernels.
# OUT=... bash benchmarks/gpu_pending_session31.sh   (build/prev: git archive 074a8e5 | tar -x -C build/prev)
set -u
L=$OUT/pending31.log
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  git rev-parse HEAD 2>/dev/null; sha1sum ula/core/triton/state.py ula/core/triton/state_join.py; } > "$L" 2>&1
mkdir -p "$OUT/varlen" "$OUT/unpacked_new" "$OUT/unpacked_prev"
echo "### packed sequences, off vs both" >> "$L"
OUT=$OUT/varlen timeout 200 python3 benchmarks/gpu_state_split.py --modes off,both --errors \
  --shapes "16384+16384,8;24576+8192,8;16384+16384,4;8192+8192+8192+8192,4" \
  --ops linear,normalized,scalar,mlstm_exp,gla >> "$L" 2>&1; echo "rc=$?" >> "$L"
echo "### unpacked, this tree" >> "$L"
OUT=$OUT/unpacked_new timeout 80 python3 benchmarks/gpu_state_split.py --modes off,both --shapes "1,16384,8;1,16384,4" \
  --ops linear,normalized,mlstm_exp >> "$L" 2>&1; echo "rc=$?" >> "$L"
echo "### unpacked, the tree before (074a8e5)" >> "$L"
(cd build/prev && OUT=$OUT/unpacked_prev timeout 80 python3 benchmarks/gpu_state_split.py --modes off,both \
  --shapes "1,16384,8;1,16384,4" --ops linear,normalized,mlstm_exp) >> "$L" 2>&1; echo "rc=$?" >> "$L"
echo "### smoke" >> "$L"
timeout 100 python3 benchmarks/gpu_smoke.py >> "$L" 2>&1; echo "rc=$?" >> "$L"
echo "### ULA_TEST_GPU=1 suite" >> "$L"
ULA_TEST_GPU=1 timeout 100 python3 -m pytest -q -n 8 -p no:cacheprovider tests -rfE 2>&1 | tail -15 >> "$L"
tail -80 "$L"
