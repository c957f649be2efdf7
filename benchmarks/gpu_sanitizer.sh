#!/usr/bin/env bash
# Out-of-bounds check of the Triton kernels (issue 8, item 3): one small odd shape of every decay kind
# (initial and final state, forward and backward), a varlen case and the families (gla, mlstm sig / exp,
# gsa, normalized), backend="triton", under `compute-sanitizer --tool memcheck`.
#
#     bash benchmarks/gpu_sanitizer.sh          # writes $OUT (default /tmp): gpu_sanitizer_summary.txt,
#                                               # gpu_sanitizer.log (memcheck's full output), the payload's JSON
#
# The payload (`python3 benchmarks/gpu_hardening.py --child sanitize`) runs once without the sanitizer first,
# so that Triton's compiler output is cached and what runs under memcheck is the kernels; then under
# memcheck with PyTorch's caching allocator off (every tensor its own allocation: a read past a tensor's
# end is caught instead of landing in a neighbour of the same cached block). Exit status 0 when memcheck
# reports no error (or is not installed, which the summary says), 1 otherwise.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp}
PY=${PYTHON:-python3}
mkdir -p "$OUT/sanitizer_warmup"
SUM="$OUT/gpu_sanitizer_summary.txt"
LOG="$OUT/gpu_sanitizer.log"

SAN=$(command -v compute-sanitizer || true)
if [ -z "$SAN" ]; then
  SAN=$(ls /usr/local/cuda*/bin/compute-sanitizer /usr/local/cuda*/compute-sanitizer/compute-sanitizer \
           /opt/nvidia*/*/bin/compute-sanitizer 2>/dev/null | head -n 1 || true)
fi

{
  echo "command: bash benchmarks/gpu_sanitizer.sh"
  echo "date: $(date '+%Y-%m-%d %H:%M:%S')"
  echo "gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n 1)"
  $PY -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
} > "$SUM" 2>&1

if [ -z "$SAN" ]; then
  echo "compute-sanitizer: NOT FOUND (looked on PATH and in /usr/local/cuda*/bin); nothing checked" >> "$SUM"
  cat "$SUM"
  exit 0
fi
echo "compute-sanitizer: $SAN ($("$SAN" --version 2>&1 | tail -n 1))" >> "$SUM"

t0=$(date +%s)
$PY benchmarks/gpu_hardening.py --child sanitize --budget-s 100000 --out "$OUT/sanitizer_warmup" > "$OUT/sanitizer_warmup/payload.log" 2>&1
echo "warm-up run (no sanitizer): exit $?, $(( $(date +%s) - t0 )) s" >> "$SUM"

t0=$(date +%s)
PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 900 "$SAN" --tool memcheck --report-api-errors no --leak-check no \
  --print-limit 200 $PY benchmarks/gpu_hardening.py --child sanitize --budget-s 100000 > "$LOG" 2>&1
rc=$?
echo "memcheck run: exit $rc, $(( $(date +%s) - t0 )) s (124: timed out after 900 s)" >> "$SUM"
echo "payload cases (from the memcheck run):" >> "$SUM"
grep -E '^\{"section": "sanitize"' "$LOG" | sed 's/^/  /' >> "$SUM"
echo "memcheck findings:" >> "$SUM"
grep -E "ERROR SUMMARY|Invalid (__global__|__shared__|__local__)|out of bounds|Program hit|Address .* is" "$LOG" \
  | sort | uniq -c | sort -rn | head -n 40 | sed 's/^/  /' >> "$SUM"
cat "$SUM"
if grep -qE '^\{"section": "sanitize".*"error"' "$LOG"; then
  echo "RESULT: a payload case failed (see the rows above)" | tee -a "$SUM"
  exit 1
fi
if [ $rc -eq 0 ] && grep -q "ERROR SUMMARY: 0 errors" "$LOG"; then
  echo "RESULT: memcheck clean" | tee -a "$SUM"
  exit 0
fi
echo "RESULT: memcheck reported errors or did not finish (see $LOG)" | tee -a "$SUM"
exit 1
