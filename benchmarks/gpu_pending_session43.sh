#!/bin/bash
# Session 43's GPU calls (run from the repository root with $OUT set):
#     bash benchmarks/gpu_pending_session43.sh 1   # one H200 (its 16 CPU cores): the CPU suite's flake hunt,
#                                                  # fresh seeds each round (scripts/flake_hunt.sh)
#     bash benchmarks/gpu_pending_session43.sh 2   # one H200: the entry term's kernels alone at one rank's slice,
#                                                  # the default warps and 4 (benchmarks/gpu_entry_term_micro.py)
#     bash benchmarks/gpu_pending_session43.sh 3   # 2 H200s (nvidia-h200-x2): session 39's part 4 (mLSTMexp's
#                                                  # context-parallel check and the two mLSTMs' times), then
#                                                  # mLSTMexp's phases (gpu_cp_profile.py --phases)
#     bash benchmarks/gpu_pending_session43.sh 4   # the GPU suite
# Writes $OUT/pending43.log (part 1: $OUT/flake_hunt too; part 3: $OUT/pending39.log and
# $OUT/gpu_context_parallel*.json too).
NAME=pending43
source "$(dirname "$0")/gpu_pending_common.sh"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}
case "$PART" in
1) TMO=580 run SECONDS_BUDGET=540 bash scripts/flake_hunt.sh \
       --deselect tests/test_offline_compile.py::test_every_launched_configuration_compiles_for_sm90 ;;
2) for t in 4,8,8 4,4,4; do TMO=60 run ULA_ENTRY_TUNE=$t python3 benchmarks/gpu_entry_term_micro.py; done ;;
3) bash "$(dirname "$0")/gpu_pending_session39.sh" 4 > /dev/null  # its own log: $OUT/pending39.log
   TMO=100 run NCCL_NVLS_ENABLE=0 torchrun --standalone --nproc_per_node=2 benchmarks/gpu_cp_profile.py \
       --kind mlstm_exp --T 131072 --phases --reps 5 ;;
4) TMO=330 run ULA_TEST_GPU=1 python3 -m pytest -q -n 12 -p no:cacheprovider tests -rfE ;;
esac
tail -c 11000 "$LOG"
