#!/bin/bash
# Session 18: normalized attention toward 1.2x our linear attention. From the repository root with $OUT set:
#     bash benchmarks/gpu_pending_session18.sh 1   # where the time goes: one iteration's launches in order
#                                                  # (normalized, linear, normalized without the L2 norm), and the
#                                                  # output kernels' software pipelining (2, 3 stages, by hand)
#                                                  # against the default: profile and repeated calls
#     bash benchmarks/gpu_pending_session18.sh 2   # (normalized's dQ and dK passes at the default stages, the
#                                                  # backward state call's e loaded a chunk ahead) smoke, repeated
#                                                  # calls at four shapes, the ordered profile, our families on this
#                                                  # tree, .base (git archive of the commit before), this tree again
#     bash benchmarks/gpu_pending_session18.sh 3   # normalized and linear at chunks 64 and 256 (ordered profiles)
#     bash benchmarks/gpu_pending_session18.sh 4   # bf16 error against float64 of normalized and normalized_pos
# Parts 5 and 6 need results/session18_forward_ones_trial.patch applied (git apply), their switches live there.
#     bash benchmarks/gpu_pending_session18.sh 5   # (a trial, not kept) the forward's normalizer row sums as two bf16
#                                                  # matmuls (hi, lo parts of the scores) against ones, at 1 stage and
#                                                  # Triton's default: profile, repeated calls
#     bash benchmarks/gpu_pending_session18.sh 6   # (a trial, not kept) the forward's inter-chunk normalizer q·n as
#                                                  # a matmul (q a matmul operand only), default stages and 1
# Writes $OUT/pending18.log (every command's output under a header, the device line, the measured files' checksums).
NAME=pending18
source "$(dirname "$0")/gpu_pending_common.sh"
SHAPES4="2,8192,16,128,128 3,3000,4,64,128 2,4096,8,256,256 4,2048,32,32,32"
case "$PART" in
1) PRE=()
   run python3 $PROF normalized,linear,normalized_nol2
   for S in 2 3; do
     PRE=(ULA_TUNE_OUTPUT=64,64,128,4,$S)
     run "${PRE[@]}" python3 $PROF normalized,linear
     repeats normalized,linear 2,8192,16,128,128 3,3000,4,64,128
   done ;;
2) PRE=()
   run python3 benchmarks/gpu_smoke.py --parts ones,families,repeat
   repeats normalized,normalized_nol2,normalized_pos $SHAPES4
   run python3 $PROF normalized,linear
   families .:new .base:base .:new2 ;;
3) for C in 64 256; do run python3 $PROF normalized,linear --chunk $C; done ;;
4) run python3 benchmarks/gpu_hardening.py --sections quality --q-ops normalized,normalized_pos --budget-s 120 \
       --out "$OUT/quality_new" ;;
5) for V in "ULA_EXP_ONES_MM=0 ULA_EXP_FWD_STAGES=0" "ULA_EXP_ONES_MM=1 ULA_EXP_FWD_STAGES=1" "ULA_EXP_ONES_MM=1 ULA_EXP_FWD_STAGES=0" "ULA_EXP_ONES_MM=1 ULA_EXP_FWD_STAGES=2"; do
     PRE=($V)
     run "${PRE[@]}" python3 $PROF normalized
     repeats normalized,normalized_pos 2,8192,16,128,128 3,3000,4,64,128
   done ;;
6) for V in "ULA_EXP_ONES_MM=2 ULA_EXP_FWD_STAGES=0" "ULA_EXP_ONES_MM=2 ULA_EXP_FWD_STAGES=1"; do
     PRE=($V)
     run "${PRE[@]}" python3 $PROF normalized
     repeats normalized,normalized_pos 2,8192,16,128,128 3,3000,4,64,128
   done ;;
esac
echo "### done" >> "$LOG"
