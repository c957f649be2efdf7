#!/bin/bash
# Session 47's GPU calls (run from the repository root with $OUT set), two H200s:
#     bash benchmarks/gpu_pending_session47.sh 1   # mLSTMexp's context-parallel entry term with its normalizer
#                                                  # column formed by the values' kernels (one read of q, not two):
#                                                  # the check at T = 32768, this tree and .prev (git archive of
#                                                  # 77bfd61) in turn at B1 T131072 H16, two rounds
#     bash benchmarks/gpu_pending_session47.sh 3   # the same trees: the GPU time with the host ahead
#                                                  # (gpu_cp_profile.py --phases), each rank's Chrome trace (this
#                                                  # tree), and the entry kernels alone (both trees)
#     bash benchmarks/gpu_pending_session47.sh 4   # after the first try (parts 1 and 3: slower, 255 registers): a
#                                                  # decay per step as a row scale (q as loaded), the column as a
#                                                  # matmul against its float32 value in three bfloat16 parts. The
#                                                  # entry kernels alone at several launch settings
#                                                  # (ULA_ENTRY_TUNE=span,warps_fwd,warps_dq,warps_de), both trees;
#                                                  # parts 1 and 3's context-parallel timings again, both trees
#     (part 5, by hand: the dE kernel's fault hunted, then parts 3-4's --phases timings again; see RESULTS.md)
#     bash benchmarks/gpu_pending_session47.sh 6   # the final tree: --phases of both mLSTMs, this tree and .prev
#                                                  # twice, and each rank's Chrome trace of mLSTMexp
#     bash benchmarks/gpu_pending_session47.sh 2   # on the final tree: the entry kernels in bf16 against float64
#                                                  # (gpu_entry_check.py), the context-parallel check at T = 32768,
#                                                  # the GPU tests of the files this session touched, one GPU's
#                                                  # mLSTM f+b at B1 T65536 (the segments' entry terms), both
#                                                  # trees, and smoke
#     bash benchmarks/gpu_pending_session47.sh 7   # one H200: the GPU suite on the session's final tree
# Writes $OUT/pending47.log and each run's JSON.
NAME=pending47
source "$(dirname "$0")/gpu_pending_common.sh"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}
case "$PART" in
1) cp_mlstm_check cp_check.json
   cp_mlstm_times round1 round2 ;;
3) for t in . .prev; do
     TMO=150 run $CP $t/benchmarks/gpu_cp_profile.py --phases --kind mlstm_exp --T 131072 --reps 9
   done
   TMO=150 run $CP benchmarks/gpu_cp_profile.py --kind mlstm_exp --T 131072 --trace
   for r in 0 1; do mv "$OUT/cp_trace_rank$r.json" "$OUT/cp_trace_mlstm_exp_rank$r.json"; done
   for t in .:new .prev:prev; do
     TMO=100 run python3 "${t%%:*}"/benchmarks/gpu_entry_term_micro.py
   done ;;
4) for tune in "" 4,8,4,4 4,4,4,8 2,4,4,4 8,4,4,4; do
     TMO=60 run ${tune:+ULA_ENTRY_TUNE=$tune} python3 benchmarks/gpu_entry_term_micro.py
   done
   TMO=60 run python3 .prev/benchmarks/gpu_entry_term_micro.py
   for t in . .prev; do
     TMO=150 run $CP $t/benchmarks/gpu_cp_profile.py --phases --kind mlstm_exp,mlstm_sig --T 131072 --reps 9
   done
   cp_mlstm_times part4 ;;
6) for round in 1 2; do
     for t in . .prev; do
       TMO=150 run $CP $t/benchmarks/gpu_cp_profile.py --phases --kind mlstm_exp,mlstm_sig --T 131072 --reps 9
     done
   done
   TMO=150 run $CP benchmarks/gpu_cp_profile.py --kind mlstm_exp --T 131072 --trace
   for r in 0 1; do mv "$OUT/cp_trace_rank$r.json" "$OUT/cp_trace_mlstm_exp_rank$r.json"; done ;;
2) TMO=60 run python3 benchmarks/gpu_entry_check.py
   cp_mlstm_check cp_check_final.json
   TMO=240 run ULA_TEST_GPU=1 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_context_parallel.py \
       tests/test_state_split.py tests/test_ones.py tests/test_ops_mlstm.py -rfE
   for t in .:new .prev:prev; do
     TMO=100 run python3 "${t%%:*}"/benchmarks/gpu_families_vs_peers.py --sections ops --ours mlstm_exp,mlstm_sig \
         --peers none --graph --rounds 2 --shape 1,65536,16,128,128 --budget-s 60 --out "$OUT/fam_${t##*:}_B1T65536"
   done
   TMO=120 run python3 benchmarks/gpu_smoke.py --parts ones,families,repeat ;;
7) TMO=430 run ULA_TEST_GPU=1 python3 -m pytest -q -n 8 -p no:cacheprovider tests -rfE ;;
esac
tail -c 11000 "$LOG"
