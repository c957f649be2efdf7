#!/bin/bash
# Session 39's GPU calls (run from the repository root with $OUT set), on 2 GPUs (nvidia-h200-x2):
#     bash benchmarks/gpu_pending_session39.sh 1   # after the session's fixes (context parallelism: checks raised on
#                                                  # every rank, key gate passed to each rank's local pass; gated keys
#                                                  # kept float32 on the PyTorch path): the GPU suite and the smoke's
#                                                  # repeat part
#     bash benchmarks/gpu_pending_session39.sh 2   # GLA, mLSTMsig and mLSTMexp with context parallelism over NCCL:
#                                                  # every rank's output and gradients against one GPU's, bf16
#     bash benchmarks/gpu_pending_session39.sh 3   # time and peak memory of mLSTMexp, mLSTMsig and GLA on 1 GPU
#                                                  # (whole sequence) against 2 GPUs (half each), T = 131072, bf16;
#                                                  # then the GPU suite again
#     bash benchmarks/gpu_pending_session39.sh 4   # after mLSTMexp's context-parallel path took the one-GPU path's
#                                                  # Triton gate kernels and fused epilogue: part 2's check, then
#                                                  # part 3's timings of the two mLSTMs
#     bash benchmarks/gpu_pending_session39.sh 5   # where the families' context-parallel time goes: each rank's
#                                                  # slice alone against with cp_group (gpu_cp_profile.py --phases)
# Writes $OUT/pending39.log and part 2's $OUT/gpu_context_parallel.json.
NAME=pending39
source "$(dirname "$0")/gpu_pending_common.sh"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}
case "$PART" in
1) TMO=330 run ULA_TEST_GPU=1 python3 -m pytest -q -n 8 -p no:cacheprovider tests -rfE
   TMO=90 run python3 benchmarks/gpu_smoke.py --parts repeat ;;
2) TMO=400 run NCCL_NVLS_ENABLE=0 torchrun --standalone --nproc_per_node=2 benchmarks/gpu_context_parallel.py \
       --kinds "" --families mlstm_exp,mlstm_exp_pos,mlstm_sig,gla --grad-T 32768 --T_long 0 ;;
3) TMO=240 run NCCL_NVLS_ENABLE=0 torchrun --standalone --nproc_per_node=2 benchmarks/gpu_context_parallel.py \
       --kinds mlstm_exp,mlstm_sig,gla --T 131072 --T_long 0 --reps 5
   TMO=330 run ULA_TEST_GPU=1 python3 -m pytest -q -n 8 -p no:cacheprovider tests -rfE ;;
4) TMO=300 run NCCL_NVLS_ENABLE=0 torchrun --standalone --nproc_per_node=2 benchmarks/gpu_context_parallel.py \
       --kinds "" --families mlstm_exp,mlstm_exp_pos --grad-T 32768 --T_long 0
   cp "$OUT/gpu_context_parallel.json" "$OUT/gpu_context_parallel_check.json"
   TMO=240 run NCCL_NVLS_ENABLE=0 torchrun --standalone --nproc_per_node=2 benchmarks/gpu_context_parallel.py \
       --kinds mlstm_exp,mlstm_sig --T 131072 --T_long 0 --reps 5 ;;
5) for K in gla mlstm_sig mlstm_exp; do
     TMO=100 run NCCL_NVLS_ENABLE=0 torchrun --standalone --nproc_per_node=2 benchmarks/gpu_cp_profile.py \
         --kind $K --T 131072 --phases --reps 5
   done ;;
esac
tail -c 11000 "$LOG"
