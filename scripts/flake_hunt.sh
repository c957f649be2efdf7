#!/usr/bin/env bash
# Flake hunt: the CPU suite (Triton through its interpreter, the GPU hidden by tests/conftest.py) round after round,
# each round with fresh seeds, on a many-core machine, until the next round would pass SECONDS_BUDGET. Prints each
# round's summary and its failures; a failure's message carries the seed to replay it (ULA_TEST_SEED=<seed>).
# usage: SECONDS_BUDGET=540 bash scripts/flake_hunt.sh [pytest args, e.g. --deselect ...]
# Logs go to $OUT/flake_hunt (the device tool's folder) or /tmp/flake_hunt.
set -uo pipefail
cd "$(dirname "$0")/.."
budget=${SECONDS_BUDGET:-540}
logs=${OUT:-/tmp}/flake_hunt
mkdir -p "$logs"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}  # ula importable here and in the processes tests spawn
python3 -c "import sys, torch, triton; print(sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__)"
echo "$(nproc) cores; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
start=$(date +%s); last=0; r=0
while :; do
  now=$(date +%s)
  if [ "$r" -gt 0 ] && [ $((now - start + last * 11 / 10)) -gt "$budget" ]; then break; fi
  r=$((r + 1))
  python3 -m pytest -q -n "$(nproc)" -p no:cacheprovider tests "$@" > "$logs/round$r.log" 2>&1
  last=$(($(date +%s) - now))
  echo "round $r (${last} s): $(tail -1 "$logs/round$r.log")"
  grep -E "^(FAILED|ERROR) " "$logs/round$r.log"
  grep -E "^E +(AssertionError|assert)" "$logs/round$r.log" | head -20
done
