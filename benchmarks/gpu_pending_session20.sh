#!/bin/bash
# Session 20: normalized attention toward 1.2x our linear attention. From the repository root with $OUT set:
#     bash benchmarks/gpu_pending_session20.sh 1   # (the sums of v in the forward's state call, the pass before the
#                                                  # forward only the L2 norm of q and k, one launch) ordered profiles,
#                                                  # the norm's tiles (ULA_TUNE_L2NORM), smoke, repeated calls at four
#                                                  # shapes, bf16 error, graph replays of this tree and .prev (git
#                                                  # archive of commit a29f64d)
#     bash benchmarks/gpu_pending_session20.sh 2   # (trials) the dQ and dK passes' projection row loaded before
#                                                  # their matmuls (ULA_EXP_PROJ_EARLY=1), the L2 norm's streaming loads
#                                                  # and stores (ULA_EXP_L2_CACHE=1): ordered profiles, repeated calls;
#                                                  # what a row pass reaches here (gpu_rowpass_bandwidth.py)
#     bash benchmarks/gpu_pending_session20.sh 3   # (the projection's rows loaded early, as committed) what a row
#                                                  # pass reaches, ordered profile, smoke, repeated calls, bf16 error,
#                                                  # graph replays of this tree and .prev (commit aa2f8f1)
#     bash benchmarks/gpu_pending_session20.sh 4   # (the forward's normalizer q·n as a bf16 matmul against n in three
#                                                  # parts, not q read again: ULA_EXP_DEN_MM=1, the default; 0 the
#                                                  # former) ordered profiles of normalized and mLSTMexp both ways,
#                                                  # repeated calls of both at four shapes, smoke, bf16 error, graph
#                                                  # replays of this tree and .prev (commit 59d2877)
#     bash benchmarks/gpu_pending_session20.sh 5   # the output kernel's tiles, warps and stages by hand
#                                                  # (ULA_TUNE_OUTPUT): ordered profiles of normalized, to read the dQ
#                                                  # and dK passes with the L2 norm's backward (which spill at 4 warps)
#     bash benchmarks/gpu_pending_session20.sh 6   # (q's L2 norm inside the forward's output kernel, from its second
#                                                  # read of q; k's norm alone before; the backward reads q as given,
#                                                  # its rows weighted by 1 / |q|) ordered profiles, smoke, repeated
#                                                  # calls at four shapes, bf16 error, graph replays of this tree and
#                                                  # .prev (commit da7f4ac)
#     bash benchmarks/gpu_pending_session20.sh 7   # the same after q's weights moved into the division's backward
#                                                  # kernel (|r| / d, |r| dden, a / (b |r|): no PyTorch ops between)
#     bash benchmarks/gpu_pending_session20.sh 8   # gpu_smoke.py's families with normalized attention's fused path
#                                                  # under varlen, an initial state, a learnable a and zero rows; the
#                                                  # state kernel with whole K rows (ULA_TUNE_STATE=128,128,BV,8), for
#                                                  # k's norm inside it: ordered profiles
#     bash benchmarks/gpu_pending_session20.sh 9   # (a trial, reverted: k's L2 norm inside the forward's state
#                                                  # call, which writes the normalized rows for the later passes; no
#                                                  # pass before) ordered
#                                                  # profiles, the state tiles, smoke, repeated calls at four shapes,
#                                                  # bf16 error, graph replays of this tree and .prev (commit e95e0b3)
# Writes $OUT/pending20.log (every command's output under a header, the device line, the measured files' checksums).
NAME=pending20
source "$(dirname "$0")/gpu_pending_common.sh"
case "$PART" in
1) run python3 $PROF normalized,normalized_nol2,linear
   for P in 4096,4 8192,8 32768,8; do
     PRE=(ULA_TUNE_L2NORM=$P); run "${PRE[@]}" python3 $PROF normalized
   done
   PRE=()
   normalized_checks ;;
2) run python3 benchmarks/gpu_rowpass_bandwidth.py
   run ULA_EXP_L2_CACHE=1 python3 benchmarks/gpu_rowpass_bandwidth.py
   run python3 $PROF normalized
   for X in ULA_EXP_PROJ_EARLY=1 ULA_EXP_L2_CACHE=1; do PRE=($X); run "${PRE[@]}" python3 $PROF normalized; done
   PRE=(ULA_EXP_PROJ_EARLY=1)
   repeats normalized,normalized_pos 2,8192,16,128,128 3,3000,4,64,128 ;;
4) for X in 1 0; do PRE=(ULA_EXP_DEN_MM=$X); run "${PRE[@]}" python3 $PROF normalized,mlstm_exp,mlstm_sig; done
   PRE=()
   repeats mlstm_exp 2,8192,16,128,128 3,3000,4,64,128 2,4096,8,256,256 4,2048,32,32,32
   normalized_checks ;;
5) for P in 64,64,128,8 64,64,128,8,1 64,64,128,4,1 64,64,128,4,3 32,64,128,4 64,32,128,4; do
     PRE=(ULA_TUNE_OUTPUT=$P); run "${PRE[@]}" python3 $PROF normalized
   done ;;
6|7) run python3 $PROF normalized,normalized_nol2,linear
   normalized_checks ;;
8) run python3 benchmarks/gpu_smoke.py --parts families,repeat
   for P in 128,128,32,8 128,128,64,8; do PRE=(ULA_TUNE_STATE=$P); run "${PRE[@]}" python3 $PROF normalized,linear; done
   PRE=() ;;
9) run python3 $PROF normalized,normalized_nol2,linear
   PRE=(ULA_TUNE_STATE=128,128,64,8); run "${PRE[@]}" python3 $PROF normalized
   PRE=()
   normalized_checks ;;
3) run python3 benchmarks/gpu_rowpass_bandwidth.py
   run python3 $PROF normalized,normalized_nol2,linear
   normalized_checks ;;
esac
echo "### done" >> "$LOG"
