#!/bin/bash
# Session 45's GPU calls (run from the repository root with $OUT set), on 2 GPUs (nvidia-h200-x2):
#     bash benchmarks/gpu_pending_session45.sh 1   # after session 44's state-kernel split for calls with the column
#                                                  # of ones: the context-parallel check of the families at
#                                                  # T = 32768 (every rank against one GPU), then mLSTMexp, mLSTMsig
#                                                  # and GLA on 1 GPU (whole sequence) against 2 GPUs (half each) at
#                                                  # T = 131072, split off (ULA_STATE_SPLIT=1) and on, two rounds
#     bash benchmarks/gpu_pending_session45.sh 2   # where mLSTMexp's context-parallel time goes now: each rank's
#                                                  # slice alone against with cp_group (gpu_cp_profile.py --phases)
#     bash benchmarks/gpu_pending_session45.sh 3   # the profiler's tables and each rank's Chrome trace of mLSTMexp's and
#                                                  # mLSTMsig's context-parallel forward+backward (gpu_cp_profile.py
#                                                  # --trace; traces renamed $OUT/cp_trace_<kind>_rank<r>.json)
#     bash benchmarks/gpu_pending_session45.sh 4   # the host's share of the families' context-parallel time:
#                                                  # gpu_cp_host.py (alone against cp, with and without the host
#                                                  # running ahead, and a cProfile of the context-parallel calls)
#     bash benchmarks/gpu_pending_session45.sh 5   # experiment: mLSTMexp's context-parallel host time with the metadata
#                                                  # gather's side stream at high priority (ULA_EXP_PRIO=1) and with
#                                                  # one metadata gather per call instead of two (ULA_EXP_ONE=1);
#                                                  # toggles of that experiment's tree, since removed (both kept)
#     bash benchmarks/gpu_pending_session45.sh 6   # after both were kept: part 1's check and timings (one round),
#                                                  # and gpu_cp_host.py on the three families
#     bash benchmarks/gpu_pending_session45.sh 7   # part 3's traces again after the changes, for mLSTMexp and GLA
#     bash benchmarks/gpu_pending_session45.sh 8   # part 6's timings again (a second round)
#     bash benchmarks/gpu_pending_session45.sh 9   # the GPU suite on the session's final tree
#     bash benchmarks/gpu_pending_session45.sh 10  # GLA's entry term forward at one rank's slice (B1 L65536 H16 K=V=128,
#                                                  # a decay per feature): chunks per program and warps
#                                                  # (ULA_ENTRY_TUNE="span,warps_fwd,warps_dq"; default 4,8,8)
# Writes $OUT/pending45.log and $OUT/cp_*.json. (The runs of parts 4-8 used benchmarks/gpu_cp_host.py, merged in
# session 46 into gpu_cp_profile.py --phases, which the commands below now call.)
NAME=pending45
source "$(dirname "$0")/gpu_pending_common.sh"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}
CP="NCCL_NVLS_ENABLE=0 torchrun --standalone --nproc_per_node=2 benchmarks/gpu_context_parallel.py"
case "$PART" in
1) TMO=300 run $CP --kinds "" --families mlstm_exp,mlstm_exp_pos,mlstm_sig,gla --grad-T 32768 --T_long 0
   cp "$OUT/gpu_context_parallel.json" "$OUT/cp_check.json"
   for R in 1 2; do
     for S in off on; do
       if [ $S = off ]; then PRE=(ULA_STATE_SPLIT=1); else PRE=(); fi
       TMO=240 run "${PRE[@]}" $CP --kinds mlstm_exp,mlstm_sig,gla --T 131072 --T_long 0 --reps 5
       cp "$OUT/gpu_context_parallel.json" "$OUT/cp_time_split_${S}_round$R.json"
     done
   done ;;
2) TMO=100 run NCCL_NVLS_ENABLE=0 torchrun --standalone --nproc_per_node=2 benchmarks/gpu_cp_profile.py \
       --kind mlstm_exp --T 131072 --phases --reps 5 ;;
3|7) KS="mlstm_exp mlstm_sig"; [ "$PART" = 7 ] && KS="mlstm_exp gla"
   for K in $KS; do
     TMO=100 run NCCL_NVLS_ENABLE=0 torchrun --standalone --nproc_per_node=2 benchmarks/gpu_cp_profile.py \
         --kind $K --T 131072 --trace
     for r in 0 1; do mv "$OUT/cp_trace_rank$r.json" "$OUT/cp_trace_${K}_rank$r.json"; done
   done ;;
8) TMO=240 run $CP --kinds mlstm_exp,mlstm_sig,gla --T 131072 --T_long 0 --reps 5
   cp "$OUT/gpu_context_parallel.json" "$OUT/cp_time_after_round2.json"
   TMO=200 run NCCL_NVLS_ENABLE=0 torchrun --standalone --nproc_per_node=2 benchmarks/gpu_cp_profile.py \
       --phases --kind mlstm_exp --T 131072 --reps 9 ;;
9) TMO=400 run ULA_TEST_GPU=1 python3 -m pytest -q -n 8 -p no:cacheprovider tests -rfE ;;
10) for TU in "" 1,8,8 2,8,8 8,8,8 2,4,8 4,4,8 1,4,8; do
     if [ -n "$TU" ]; then PRE=(ULA_ENTRY_TUNE=$TU); else PRE=(); fi
     TMO=60 run "${PRE[@]}" python3 benchmarks/gpu_entry_term_micro.py --vector --reps 30
   done ;;
4) TMO=200 run NCCL_NVLS_ENABLE=0 torchrun --standalone --nproc_per_node=2 benchmarks/gpu_cp_profile.py \
       --phases --kind mlstm_exp,mlstm_sig,gla --T 131072 --cprofile ;;
5) for E in "ULA_EXP_PRIO=0" "ULA_EXP_PRIO=1" "ULA_EXP_ONE=1" "ULA_EXP_PRIO=1 ULA_EXP_ONE=1" "ULA_EXP_PRIO=0"; do
     echo "### experiment: $E" >> "$LOG"
     TMO=100 run $E NCCL_NVLS_ENABLE=0 torchrun --standalone --nproc_per_node=2 benchmarks/gpu_cp_profile.py \
         --phases --kind mlstm_exp --T 131072 --reps 9 --cprofile
   done ;;
6) TMO=300 run $CP --kinds "" --families mlstm_exp,mlstm_exp_pos,mlstm_sig,gla --grad-T 32768 --T_long 0
   cp "$OUT/gpu_context_parallel.json" "$OUT/cp_check_after.json"
   TMO=240 run $CP --kinds mlstm_exp,mlstm_sig,gla --T 131072 --T_long 0 --reps 5
   cp "$OUT/gpu_context_parallel.json" "$OUT/cp_time_after.json"
   TMO=200 run NCCL_NVLS_ENABLE=0 torchrun --standalone --nproc_per_node=2 benchmarks/gpu_cp_profile.py \
       --phases --kind mlstm_exp,mlstm_sig,gla --T 131072 --reps 9 ;;
esac
rm -f "$OUT/gpu_context_parallel.json"
tail -c 11000 "$LOG"
