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
# Writes $OUT/pending17.log (every command's output under a header, the device line, the measured files' checksums).
NAME=pending17
source "$(dirname "$0")/gpu_pending_common.sh"
if [ "$PART" = 1 ]; then
run python3 benchmarks/gpu_smoke.py --parts ones,families,repeat
for SH in 2,8192,16,128,128 3,3000,4,64,128; do
    run python3 benchmarks/gpu_repeat_calls.py --ops normalized --shape $SH --calls 3 --grad
done
Q="--sections quality --q-ops normalized,normalized_pos --budget-s 120"
run python3 benchmarks/gpu_hardening.py $Q --out "$OUT/quality_new"
run python3 .base/benchmarks/gpu_hardening.py $Q --out "$OUT/quality_base"
run python3 benchmarks/gpu_profile.py --kinds normalized,linear,normalized_nol2
fi
if [ "$PART" = 2 ]; then
FAM="--sections ops --ours normalized,linear,normalized_nol2 --peers none --rounds 3 --graph --budget-s 150"
run python3 benchmarks/gpu_families_vs_peers.py $FAM --out "$OUT/fam_new"
run python3 .base/benchmarks/gpu_families_vs_peers.py $FAM --out "$OUT/fam_base"
run python3 benchmarks/gpu_families_vs_peers.py $FAM --out "$OUT/fam_new2"
fi
if [ "$PART" = 3 ]; then
run python3 benchmarks/gpu_smoke.py --parts ones,families,repeat
for SH in 2,8192,16,128,128 3,3000,4,64,128 2,4096,8,256,256 4,2048,32,32,32; do
    run python3 benchmarks/gpu_repeat_calls.py --ops normalized --shape $SH --calls 3 --grad
done
run python3 benchmarks/gpu_hardening.py --sections quality --q-ops normalized,normalized_pos --budget-s 120 \
    --out "$OUT/quality_new"
run python3 benchmarks/gpu_profile.py --kinds normalized,linear,normalized_nol2
FAM="--sections ops --ours normalized,linear,normalized_nol2 --peers none --rounds 3 --graph --budget-s 150"
run python3 benchmarks/gpu_families_vs_peers.py $FAM --out "$OUT/fam_new"
run python3 .base/benchmarks/gpu_families_vs_peers.py $FAM --out "$OUT/fam_base"
run python3 benchmarks/gpu_families_vs_peers.py $FAM --out "$OUT/fam_new2"
fi
echo "### done" >> "$LOG"
