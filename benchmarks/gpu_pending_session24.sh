#!/bin/bash
# Session 24: normalized attention's division backward formed by the dQ pass (no kernel reads the output for it), a
# trial not kept: its code and knobs are benchmarks/results/session24_division_in_dq_trial.patch (apply it first).
# From the repository root with $OUT set and the previous tree carried as _prev (git archive; part 1's .prev did not
# travel to the GPU machine):
#     bash benchmarks/gpu_pending_session24.sh 1   # smoke, repeated calls at four shapes, bf16 errors, graph replays
#                                                  # of this tree and .prev, ordered profiles
#     bash benchmarks/gpu_pending_session24.sh 2   # ordered profiles of the previous tree (_prev) and of this one at
#                                                  # the dQ pass's trial knobs (ULA_EXP_DIVB, ULA_EXP_DIVB_CFG)
#     bash benchmarks/gpu_pending_session24.sh 3   # timing ablations of the dQ pass (wrong results: nomm, nosum)
#     bash benchmarks/gpu_pending_session24.sh 4   # (this tree, no patch) normalized against linear attention on the
#                                                  # same L2-normalized q, k (F.normalize; ula's L2 kernels)
# Writes $OUT/pending24.log (every command's output under a header, the device line, the measured files' checksums).
NAME=pending24
source "$(dirname "$0")/gpu_pending_common.sh"
case "$PART" in
1) normalized_checks
   run python3 $PROF normalized,normalized_nol2,linear ;;
2) run python3 _prev/$PROF normalized,normalized_nol2,linear
   run python3 $PROF normalized,normalized_nol2
   for X in late plain late,plain; do run ULA_EXP_DIVB=$X python3 $PROF normalized,normalized_nol2; done
   for C in 8,3 4,1 4,2 8,2; do run ULA_EXP_DIVB_CFG=$C python3 $PROF normalized,normalized_nol2; done
   run ULA_EXP_DIVB=late,plain ULA_EXP_DIVB_CFG=8,2 python3 $PROF normalized,normalized_nol2 ;;
3) for X in nomm nosum nomm,nosum nomm,nosum,plain; do
     run ULA_EXP_DIVB=$X ULA_EXP_DIVB_CFG=4,1 python3 $PROF normalized_nol2
   done ;;
4) run python3 benchmarks/gpu_families_vs_peers.py --sections ops --peers none --rounds 3 --graph --budget-s 200 \
       --ours normalized,linear,normalized_nol2,linear_l2,linear_l2_fused --out "$OUT/fam_l2"
   run python3 $PROF normalized,linear,linear_l2,linear_l2_fused ;;
esac
echo "### done" >> "$LOG"
