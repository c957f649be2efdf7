#!/bin/bash
# Session 41's GPU calls (one H200; run from the repository root with $OUT set, the peers' wheels on PYTHONPATH):
#     bash benchmarks/gpu_pending_session41.sh 1   # the final tree of session 40 (H200 rule with its tf32 condition,
#                                                  # the review's moves): the GPU suite, the smoke, GLA and HGRN2 with
#                                                  # the H200's tiles against the H100's
#     bash benchmarks/gpu_pending_session41.sh 2   # issue 4's bars on the same tree (= gpu_pending_session25.sh 1)
# Writes $OUT/pending41.log (part 1) or $OUT/pending25.log and $OUT/fam1/gpu_families_vs_peers.json (part 2).
NAME=pending41
source "$(dirname "$0")/gpu_pending_common.sh"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}
case "$PART" in
1) TMO=260 run ULA_TEST_GPU=1 python3 -m pytest -q -n 8 -p no:cacheprovider tests -rfE
   TMO=90 run python3 benchmarks/gpu_smoke.py --parts families,repeat
   TMO=150 run python3 benchmarks/gpu_h200_tiles.py --ops gla,hgrn2,gsa --rounds 2 ;;
2) bash "$(dirname "$0")/gpu_pending_session25.sh" 1; exit ;;
esac
tail -c 11000 "$LOG"
