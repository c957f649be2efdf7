#!/bin/bash
# Session 46's GPU calls (run from the repository root with $OUT set), one H200:
#     bash benchmarks/gpu_pending_session46.sh 1   # mLSTMexp's backward with the forward's column borders given
#                                                  # (no column summed in its second state call): each state call
#                                                  # alone (gpu_state_calls.py), then mLSTMexp and mLSTMsig f+b
#                                                  # graph replays of this tree and .prev (git archive of c34a2c8)
#                                                  # in turn at B2 T8192 and B1 T65536 H16
#     bash benchmarks/gpu_pending_session46.sh 3   # part 1's graph replays again (a second round)
#     bash benchmarks/gpu_pending_session46.sh 4   # repeated calls, smoke, and both trees' bf16 errors against
#                                                  # float64
#     bash benchmarks/gpu_pending_session46.sh 5   # 2 GPUs: the context-parallel backward of mLSTMexp with the
#                                                  # forward's column borders too (corrected by the entering
#                                                  # state's column): the check at T = 32768, then this tree and
#                                                  # .prev (git archive of 5bb2bb6) in turn, B1 T131072 H16, and
#                                                  # the GPU time with the host ahead (gpu_cp_profile.py --phases)
#     bash benchmarks/gpu_pending_session46.sh 6   # bf16 errors against float64 of mLSTMexp and normalized attention
#                                                  # at B1 T32768 and B2 T8192 H16, this tree and .base (git archive
#                                                  # of c34a2c8: the column's borders in bfloat16)
#     bash benchmarks/gpu_pending_session46.sh 7   # trial: mLSTMexp's column as a matmul with the rows' factors
#                                                  # in its split weights (ULA_EXP_SPLITF=1) against the column's
#                                                  # float32 row sums (0): state calls, f+b, repeats, smoke (first
#                                                  # `git apply benchmarks/results/session46_column_factored_split_
#                                                  # trial.patch`: the switch is the trial's, not kept)
#     bash benchmarks/gpu_pending_session46.sh 8   # 2 GPUs: gpu_cp_profile.py --phases with gpu_cp_host.py's timings
#                                                  # merged in, on the two mLSTMs
#     bash benchmarks/gpu_pending_session46.sh 9   # normalized attention against linear attention, this tree and
#                                                  # .base (c34a2c8) in turn, two rounds (run with the borders in
#                                                  # float32 in every call, at 2a081bb, then after 087b9e5)
#     bash benchmarks/gpu_pending_session46.sh 10  # after 087b9e5: smoke, and mLSTMexp / mLSTMsig f+b
#     bash benchmarks/gpu_pending_session46.sh 11  # 2 GPUs: each rank's Chrome trace of mLSTMexp's context-parallel
#                                                  # forward+backward on the final tree (for trace_kernels.py)
#     bash benchmarks/gpu_pending_session46.sh 2   # the GPU suite on the session's final tree
# Writes $OUT/pending46.log, $OUT/fam_*/ and $OUT/quality_*/ (each run's JSON).
NAME=pending46
source "$(dirname "$0")/gpu_pending_common.sh"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}
fam() {  # fam ROUND: mLSTMexp and mLSTMsig f+b graph replays, this tree and .prev in turn, two shapes
  for sh in 2,8192,16,128,128 1,65536,16,128,128; do
    for t in .:new .prev:prev; do
      TMO=150 run python3 "${t%%:*}"/benchmarks/gpu_families_vs_peers.py --sections ops --ours mlstm_exp,mlstm_sig \
          --peers none --graph --rounds 2 --shape $sh --budget-s 100 --out "$OUT/fam_${t##*:}_${sh//,/_}_$1"
    done
  done
}
case "$PART" in
1) for sh in 2,8192,16,128,128 1,65536,16,128,128; do
     TMO=120 run python3 benchmarks/gpu_state_calls.py --shape $sh
   done
   fam 1 ;;
3) fam 2 ;;
4) repeats mlstm_exp 2,8192,16,128,128 1,65536,16,128,128 3,3000,4,64,128
   TMO=200 run python3 benchmarks/gpu_smoke.py --parts ones,families,repeat
   for t in .:new .prev:prev; do
     TMO=150 run python3 "${t%%:*}"/benchmarks/gpu_hardening.py --sections quality --q-ops mlstm_exp,mlstm_sig \
         --budget-s 120 --out "$OUT/quality_${t##*:}"
   done ;;
5) cp_mlstm_check cp_check.json
   cp_mlstm_times round1 round2
   # (this tree's was benchmarks/gpu_cp_host.py, since merged into gpu_cp_profile.py --phases; .prev still has it)
   TMO=100 run $CP benchmarks/gpu_cp_profile.py --phases --kind mlstm_exp --T 131072 --reps 9
   TMO=100 run $CP .prev/benchmarks/gpu_cp_host.py --kinds mlstm_exp --T 131072 --reps 9 ;;
6) for sh in 1,32768,16,128,128 2,8192,16,128,128; do
     for t in .:new .base:base; do
       TMO=200 run python3 "${t%%:*}"/benchmarks/gpu_hardening.py --sections quality --q-ops mlstm_exp,normalized \
           --q-shape $sh --budget-s 180 --out "$OUT/quality_${t##*:}_${sh//,/_}"
     done
   done ;;
7) for sh in 2,8192,16,128,128 1,65536,16,128,128; do
     for F in 0 1; do TMO=120 run ULA_EXP_SPLITF=$F python3 benchmarks/gpu_state_calls.py --shape $sh; done
   done
   for round in 1 2; do
     for sh in 2,8192,16,128,128 1,65536,16,128,128; do
       for F in 0 1; do
         TMO=150 run ULA_EXP_SPLITF=$F python3 benchmarks/gpu_families_vs_peers.py --sections ops --ours mlstm_exp \
             --peers none --graph --rounds 2 --shape $sh --budget-s 100 --out "$OUT/fam_splitf${F}_${sh//,/_}_$round"
       done
     done
   done
   PRE=(ULA_EXP_SPLITF=1); repeats mlstm_exp 2,8192,16,128,128 1,65536,16,128,128
   TMO=100 run ULA_EXP_SPLITF=1 python3 benchmarks/gpu_smoke.py --parts ones,families ;;
8) TMO=300 run NCCL_NVLS_ENABLE=0 torchrun --standalone --nproc_per_node=2 benchmarks/gpu_cp_profile.py --phases \
       --kind mlstm_exp,mlstm_sig --T 131072 --reps 5 --cprofile ;;
9) for round in 1 2; do
     for t in .:new .base:base; do
       TMO=150 run python3 "${t%%:*}"/benchmarks/gpu_families_vs_peers.py $FAM --out "$OUT/fam_norm_${t##*:}_$round"
     done
   done ;;
10) TMO=200 run python3 benchmarks/gpu_smoke.py --parts ones,families,repeat
    TMO=100 run python3 benchmarks/gpu_families_vs_peers.py --sections ops --ours mlstm_exp,mlstm_sig --peers none \
        --graph --rounds 2 --budget-s 60 --out "$OUT/fam_mlstm" ;;
11) TMO=150 run NCCL_NVLS_ENABLE=0 torchrun --standalone --nproc_per_node=2 benchmarks/gpu_cp_profile.py \
        --kind mlstm_exp --T 131072 --trace
    for r in 0 1; do mv "$OUT/cp_trace_rank$r.json" "$OUT/cp_trace_mlstm_exp_rank$r.json"; done ;;
2) TMO=400 run ULA_TEST_GPU=1 python3 -m pytest -q -n 8 -p no:cacheprovider tests -rfE ;;
esac
tail -c 11000 "$LOG"
