#!/bin/bash
# Session 19: normalized attention toward 1.2x our linear attention. From the repository root with $OUT set:
#     bash benchmarks/gpu_pending_session19.sh 1   # the one pass before the forward (q, k normalized, v's chunk sums;
#                                                  # ula/ops/_normalized_prepare.py): ordered profile at its default
#                                                  # tile and three others (ULA_TUNE_PREPARE), smoke, repeated calls
#     bash benchmarks/gpu_pending_session19.sh 2   # (a trial) the column-of-ones forward at Triton's default stages
#                                                  # with q read again for the normalizer's float32 products
#                                                  # (ULA_EXP_DEN=1 volatile, 2 .cg): profile, repeated calls
#     bash benchmarks/gpu_pending_session19.sh 3   # graph-replay timings: this tree, .base (the commit before), again;
#                                                  # the ordered profile
#     bash benchmarks/gpu_pending_session19.sh 4   # the one pass's tiles and jobs per program (q, k, v in one program
#                                                  # or one each): ordered profiles
#     bash benchmarks/gpu_pending_session19.sh 5   # (the forward at the default stages, q read again, as committed)
#                                                  # smoke, repeated calls of normalized (3 forms) and mLSTMexp at
#                                                  # four shapes
#     bash benchmarks/gpu_pending_session19.sh 6   # (the rank-one state read where the scans leave it: no roll, no
#                                                  # copies) ordered profiles, the division backward's tiles
#                                                  # (ULA_TUNE_DIVISION_BACKWARD), smoke, repeated calls, graph
#                                                  # replays of this tree and .prev (git archive of commit fd8ef2a)
#     bash benchmarks/gpu_pending_session19.sh 7   # (the division's backward folded into the core's backward:
#                                                  # dout's rows weighted by 1 / d where the kernels read them; the
#                                                  # v sums' accumulator summed once) ordered profiles, the pass's
#                                                  # tiles, smoke, repeated calls at four shapes, bf16 error, graph
#                                                  # replays of this tree and .prev (git archive of commit 5dfb3bd)
# Writes $OUT/pending19.log (every command's output under a header, the device line, the measured files' checksums).
NAME=pending19
source "$(dirname "$0")/gpu_pending_common.sh"
case "$PART" in
1) PRE=()
   run python3 $PROF normalized,linear
   for P in 2048,4 8192,4 8192,8; do PRE=(ULA_TUNE_PREPARE=$P); run "${PRE[@]}" python3 $PROF normalized; done
   PRE=()
   run python3 benchmarks/gpu_smoke.py --parts ones,families,repeat
   repeats normalized,normalized_nol2,normalized_pos 2,8192,16,128,128 3,3000,4,64,128 ;;
2) for V in "ULA_EXP_DEN=1 ULA_EXP_FWD_STAGES=0" "ULA_EXP_DEN=2 ULA_EXP_FWD_STAGES=0" "ULA_EXP_DEN=1 ULA_EXP_FWD_STAGES=1"; do
     PRE=($V)
     run "${PRE[@]}" python3 $PROF normalized,mlstm_exp
     repeats normalized,normalized_pos,mlstm_exp 2,8192,16,128,128 3,3000,4,64,128
   done ;;
3) families .:new .base:base .:new2
   run python3 $PROF normalized,linear ;;
4) for P in 4096,4,1 4096,4,3 2048,4,3 8192,8,3 16384,8,1; do
     PRE=(ULA_TUNE_PREPARE=$P); run "${PRE[@]}" python3 $PROF normalized
   done ;;
5) PRE=()
   run python3 benchmarks/gpu_smoke.py --parts ones,families,repeat
   repeats normalized,normalized_nol2,normalized_pos,mlstm_exp 2,8192,16,128,128 3,3000,4,64,128 2,4096,8,256,256 4,2048,32,32,32 ;;
6) run python3 $PROF normalized,normalized_nol2,linear
   for P in 4096,4 8192,8 2048,4 4096,2; do
     PRE=(ULA_TUNE_DIVISION_BACKWARD=$P); run "${PRE[@]}" python3 $PROF normalized
   done
   PRE=()
   run python3 benchmarks/gpu_smoke.py --parts ones,families,repeat
   repeats normalized,normalized_nol2,normalized_pos 2,8192,16,128,128 3,3000,4,64,128
   families .:new .prev:prev ;;
7) run python3 $PROF normalized,normalized_nol2,linear
   for P in 16384,8 4096,4; do
     PRE=(ULA_TUNE_PREPARE=$P); run "${PRE[@]}" python3 $PROF normalized,normalized_nol2
   done
   PRE=()
   normalized_checks ;;
esac
echo "### done" >> "$LOG"
