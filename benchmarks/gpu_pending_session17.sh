#!/bin/bash
# Session 17: normalized attention as one Function whose a part's dv goes through the core's dV pass (a rank-one
# term there; ula/ops/_normalized_fused.py), from the repository root with $OUT set and .base (git archive of the
# commit before it, carried) for the baseline in the same run:
#     bash benchmarks/gpu_pending_session17.sh 1   # smoke (ones, families, repeat), repeated calls of normalized
#                                                  # with gradients at two shapes, its bf16 error against float64,
#                                                  # this tree's and the baseline's; the kernel profile
#     bash benchmarks/gpu_pending_session17.sh 2   # our families (graph replays) on this tree, the baseline tree,
#                                                  # this tree again
#     bash benchmarks/gpu_pending_session17.sh 3   # (the a part and the division in the core's output kernel too)
#                                                  # parts 1 and 2 in one, the repeated calls at four shapes
#     bash benchmarks/gpu_pending_session17.sh 4   # (the L2 norm's backward in the dQ and dK passes, b the core's
#                                                  # scale) part 3 again, with .prev (git archive of commit 7e61804,
#                                                  # the tree of part 3) timed too
#     bash benchmarks/gpu_pending_session17.sh 5   # (the division's backward at 16384-element tiles) repeated calls
#                                                  # at two shapes, our families against .prev (part 3's tree)
#     bash benchmarks/gpu_pending_session17.sh 6   # (a trial, reverted: the sums of v in the forward state kernel)
#                                                  # smoke, repeated calls at two shapes, the profile, our families
#                                                  # against .prev (git archive of commit c6c9ad0, part 5's tree)
# Writes $OUT/pending17.log (every command's output under a header, the device line, the measured files' checksums).
NAME=pending17
source "$(dirname "$0")/gpu_pending_common.sh"
checks() {  # smoke, quality of this tree, kernel profile
    run python3 benchmarks/gpu_smoke.py --parts ones,families,repeat
    repeats "$@"
    run python3 benchmarks/gpu_hardening.py --sections quality --q-ops normalized,normalized_pos --budget-s 120 \
        --out "$OUT/quality_new"
    run python3 benchmarks/gpu_profile.py --kinds normalized,linear,normalized_nol2
}
SHAPES4="2,8192,16,128,128 3,3000,4,64,128 2,4096,8,256,256 4,2048,32,32,32"
case "$PART" in
1) run python3 benchmarks/gpu_smoke.py --parts ones,families,repeat
   repeats normalized 2,8192,16,128,128 3,3000,4,64,128
   Q="--sections quality --q-ops normalized,normalized_pos --budget-s 120"
   run python3 benchmarks/gpu_hardening.py $Q --out "$OUT/quality_new"
   run python3 .base/benchmarks/gpu_hardening.py $Q --out "$OUT/quality_base"
   run python3 benchmarks/gpu_profile.py --kinds normalized,linear,normalized_nol2 ;;
2) families .:new .base:base .:new2 ;;
3) checks normalized $SHAPES4
   families .:new .base:base .:new2 ;;
4) checks normalized,normalized_nol2 $SHAPES4
   families .:new .prev:prev .base:base .:new2 ;;
5) repeats normalized,normalized_nol2 2,8192,16,128,128 3,3000,4,64,128
   families .:new .prev:prev .:new2 ;;
6) run python3 benchmarks/gpu_smoke.py --parts ones,families,repeat
   repeats normalized,normalized_nol2 2,8192,16,128,128 3,3000,4,64,128
   run python3 benchmarks/gpu_profile.py --kinds normalized,linear,normalized_nol2
   families .:new .prev:prev .:new2 ;;
esac
echo "### done" >> "$LOG"
