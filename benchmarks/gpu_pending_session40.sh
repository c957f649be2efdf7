#!/bin/bash
# Session 40's GPU calls (one H200; run from the repository root with $OUT set):
#     bash benchmarks/gpu_pending_session40.sh 1   # the H200's own tiles for decays per feature (backends.is_h200):
#                                                  # against the H100's in turn (gla, gsa, hgrn2); GLA and GSA
#                                                  # against fla chunk_gla (peers' wheels on PYTHONPATH); the
#                                                  # smoke; the GPU suite (first form: the output kernel's K tiles
#                                                  # too, since dropped: GSA +7.5%)
#     bash benchmarks/gpu_pending_session40.sh 2   # the state kernel's tiles alone: GLA, GSA against fla chunk_gla,
#                                                  # then HGRN2 and GSA against the H100's tiles
# Writes $OUT/pending40.log and $OUT/fam40/gpu_families_vs_peers.json.
NAME=pending40
source "$(dirname "$0")/gpu_pending_common.sh"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}
case "$PART" in
1) TMO=150 run python3 benchmarks/gpu_h200_tiles.py --ops gla,hgrn2,gsa --rounds 2
   TMO=330 run python3 benchmarks/gpu_families_vs_peers.py --graph --budget-s 320 --sections ops,peers \
       --ours gla,hgrn2,mlstm_sig --peers fla_gla --rounds 1 --out "$OUT/fam40"
   TMO=60 run python3 benchmarks/gpu_smoke.py --parts families,repeat
   TMO=200 run ULA_TEST_GPU=1 python3 -m pytest -q -n 8 -p no:cacheprovider tests -rfE ;;
2) TMO=300 run python3 benchmarks/gpu_families_vs_peers.py --graph --budget-s 290 --sections ops,peers \
       --ours gla,gsa --peers fla_gla --rounds 1 --out "$OUT/fam40"
   TMO=60 run python3 benchmarks/gpu_h200_tiles.py --ops hgrn2,gla --rounds 1 ;;
esac
tail -c 11000 "$LOG"
