#!/bin/bash
# Session 38's GPU calls, written at the end of session 37 (run from the repository root with $OUT set):
#     bash benchmarks/gpu_pending_session38.sh 1   # the full GPU suite and the smoke's repeat part (ABC's softmax
#                                                  # backward from φ came after session 37's suite run)
#     bash benchmarks/gpu_pending_session38.sh 2   # fla's chunk_abc against ula.gsa in fla's form ("abc_fla_form")
#                                                  # and ula.abc (other math, for scale), m = 64, two rounds; needs
#                                                  # fla's wheel on PYTHONPATH (../shared/peers/README.md: .whl
#                                                  # carried, pip install --target /tmp/site); fla autotunes for
#                                                  # minutes on its first call, hence a call of its own
#     bash benchmarks/gpu_pending_session38.sh 3   # part 2 again after "abc_fla_form" took its gates from ula's
#                                                  # cumulative softmax (no PyTorch logcumsumexp), and the bf16 error
#                                                  # of ours and fla's chunk_abc against float64 (same fla wheel)
#     bash benchmarks/gpu_pending_session38.sh 4   # after the session's fixes (decayed widths over 256 run in blocks,
#                                                  # float64 layers, argument checks): the GPU suite, the smoke's
#                                                  # repeat part, and bf16 errors of the wide calls
# Writes $OUT/pending38.log, part 2's and 3's $OUT/fam_abc/gpu_families_vs_peers.json, part 3's
# $OUT/quality_abc/gpu_hardening.json.
NAME=pending38
source "$(dirname "$0")/gpu_pending_common.sh"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}
case "$PART" in
1) TMO=300 run ULA_TEST_GPU=1 python3 -m pytest -q -n 8 -p no:cacheprovider tests -rfE
   TMO=90 run python3 benchmarks/gpu_smoke.py --parts repeat ;;
2) TMO=595 run python3 benchmarks/gpu_families_vs_peers.py --graph --budget-s 570 --sections ops,peers \
       --ours abc_fla_form,abc,gsa --peers fla_abc --rounds 2 --out "$OUT/fam_abc" ;;
3) TMO=300 run python3 benchmarks/gpu_families_vs_peers.py --graph --budget-s 270 --sections ops,peers \
       --ours abc_fla_form,abc,gsa --peers fla_abc --rounds 2 --out "$OUT/fam_abc"
   TMO=240 run python3 benchmarks/gpu_hardening.py --sections quality --q-ops abc_fla_form --budget-s 220 \
       --out "$OUT/quality_abc" ;;
4) TMO=300 run ULA_TEST_GPU=1 python3 -m pytest -q -n 8 -p no:cacheprovider tests -rfE
   TMO=90 run python3 benchmarks/gpu_smoke.py --parts repeat
   TMO=120 run python3 benchmarks/gpu_wide_decay.py ;;
esac
tail -c 11000 "$LOG"
