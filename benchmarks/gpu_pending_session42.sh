#!/bin/bash
# Session 42's GPU call (one H200; run from the repository root with $OUT set):
#     bash benchmarks/gpu_pending_session42.sh 1   # this session's test-only changes (the suite's order, the
#                                                  # interpreter's lazy tuple types, trimmed cases, the covering
#                                                  # offline compile) on a GPU: the GPU suite and the smoke
# Writes $OUT/pending42.log.
NAME=pending42
source "$(dirname "$0")/gpu_pending_common.sh"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}
case "$PART" in
1) TMO=330 run ULA_TEST_GPU=1 python3 -m pytest -q -n 12 -p no:cacheprovider tests -rfE
   TMO=90 run python3 benchmarks/gpu_smoke.py --parts families,repeat ;;
esac
tail -c 11000 "$LOG"
