#!/usr/bin/env bash
# ula's Triton kernels under other Triton releases, on a machine without a GPU. For each version its wheel goes into
# a folder of its own, put first on PYTHONPATH (the venv's Triton stays as it is); then
#   1. every kernel configuration a forward+backward launches is compiled for an H100 down to a cubin
#      (tests/offline_compile.py: the GPU compiler's front end and ptxas, the kernels not run), and
#   2. the test suite runs with the kernels under that Triton's interpreter (the kernels' logic).
# A Triton the GPU machines do not have can be checked this way only: its wheel is larger than what a device call
# carries. Usage: bash scripts/triton_versions.sh [VERSION ...] (default 3.2.0 ... 3.9.0); OUT=dir for the logs
# (default /tmp/ula_triton_versions); TESTS="pytest args" (default: the whole suite); SITE=dir for the wheels'
# folders (default /tmp/ula_triton). Prints one summary line per version and writes them to $OUT/summary.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
VPY="$PWD/.venv/bin/python"
OUT=${OUT:-/tmp/ula_triton_versions}
SITE=${SITE:-/tmp/ula_triton}
TESTS=${TESTS:-tests}
versions=("$@")
[ ${#versions[@]} -gt 0 ] || versions=(3.2.0 3.3.1 3.4.0 3.5.1 3.6.0 3.7.0 3.8.0 3.9.0)
mkdir -p "$OUT" "$SITE"
{
  tree="$(git rev-parse --short HEAD)$(git diff --quiet || echo +changes)"
  echo "# $(date -u +%FT%TZ) $(uname -m), $(nproc) cores; ula $tree"
  echo "# $("$VPY" -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__)')"
} | tee "$OUT/summary.txt"
for v in "${versions[@]}"; do
  dir="$SITE/$v"
  if [ ! -f "$dir/.ok" ]; then
    rm -rf "$dir"
    "$VPY" -m pip install -q --disable-pip-version-check --no-deps --no-compile --target "$dir" "triton==$v" \
      >"$OUT/install_$v.log" 2>&1 && touch "$dir/.ok"
  fi
  if [ ! -f "$dir/.ok" ]; then
    echo "triton $v: the wheel could not be installed ($OUT/install_$v.log)" | tee -a "$OUT/summary.txt"
    continue
  fi
  export PYTHONPATH="$dir:$PWD"  # this checkout's ula (not the one the venv installed) with this Triton
  got=$("$VPY" -c 'import triton; print(triton.__version__)')
  start=$SECONDS
  env -u TRITON_INTERPRET "$VPY" tests/offline_compile.py --all >"$OUT/compile_$v.txt" 2>&1
  n_ok=$(grep -c '^ok' "$OUT/compile_$v.txt")
  n_fail=$(grep -c '^FAIL' "$OUT/compile_$v.txt")
  compiled="compiled for sm_90: $n_ok ok, $n_fail failed ($((SECONDS - start)) s)"
  [ "$n_ok$n_fail" != "00" ] ||
    compiled="compile for sm_90: no kernel reached ($(grep -m1 -E 'Error' "$OUT/compile_$v.txt"))"
  start=$SECONDS
  # shellcheck disable=SC2086
  "$VPY" -m pytest -q -n auto --maxprocesses 4 -p no:cacheprovider $TESTS >"$OUT/tests_$v.txt" 2>&1
  tail_line=$(tail -n 1 "$OUT/tests_$v.txt")
  echo "triton $got: $compiled; tests: $tail_line ($((SECONDS - start)) s)" | tee -a "$OUT/summary.txt"
  unset PYTHONPATH
done
