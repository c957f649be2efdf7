#!/bin/bash
# Session 22: where normalized attention's time over linear attention goes, in bytes. From the repository root with
# $OUT set:
#     bash benchmarks/gpu_pending_session22.sh 1   # Nsight Compute counters (time, DRAM bytes read and written,
#                                                  # DRAM throughput, registers, local-memory (spill) traffic) of
#                                                  # every kernel of one forward+backward of normalized,
#                                                  # normalized_nol2 and linear (B2 T8192 H16 K=V=128 bf16), CSV per
#                                                  # kind; then the ordered profile of the three
#     bash benchmarks/gpu_pending_session22.sh 2   # the state kernel's tiles by hand (ULA_TUNE_STATE=BT,BK,BV,warps
#                                                  # [,stages]): ordered profiles of normalized and linear at each
#     bash benchmarks/gpu_pending_session22.sh 3   # the state kernel at 4 and 5 software-pipelining stages
#                                                  # against Triton's default: graph replays of every family,
#                                                  # repeated calls (ran with the trial's knob ULA_EXP_STATE_STAGES,
#                                                  # since removed: part 4 measures what was kept)
#     bash benchmarks/gpu_pending_session22.sh 4   # 4 stages kept for the state calls without decay or gate: ordered
#                                                  # profile, repeated calls, smoke, graph replays of linear and
#                                                  # normalized for this tree and .prev (git archive of 980c7fc)
#     bash benchmarks/gpu_pending_session22.sh 5   # trials, not kept (results/session22_state_trials.patch; its
#                                                  # knobs: ULA_EXP_STATE_BAL, the forward state call's v sums and
#                                                  # normalizer column spread over its programs, one each;
#                                                  # ULA_EXP_W_ON_K, the reverse call's weights on k's rows, not v's):
#                                                  # ordered profiles, graph replays, repeated calls
#     bash benchmarks/gpu_pending_session22.sh 6   # the output kernel's stages by hand (ULA_TUNE_OUTPUT=64,64,128,4,S):
#                                                  # ordered profiles of normalized and linear, repeated calls
#     bash benchmarks/gpu_pending_session22.sh 7   # the state kernel at 4 warps (ULA_TUNE_STATE), ordered profiles
#     bash benchmarks/gpu_pending_session22.sh 8   # 4 warps for the column-of-ones state calls without decay or gate
#                                                  # (normalized's): ordered profile, repeated calls, smoke, graph
#                                                  # replays of this tree and .prev (git archive of 861319f)
#     bash benchmarks/gpu_pending_session22.sh 9   # part 8's change on an H100: repeated calls, graph replays of this
#                                                  # tree and .prev (861319f)
#     bash benchmarks/gpu_pending_session22.sh 10  # more state tiles at 4 warps (ULA_TUNE_STATE): ordered profiles of
#                                                  # normalized
# Writes $OUT/pending22.log (every command's output under a header, the device line, the measured files' checksums).
NAME=pending22
source "$(dirname "$0")/gpu_pending_common.sh"
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
MET=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum
MET=$MET,dram__throughput.avg.pct_of_peak_sustained_elapsed,launch__registers_per_thread,launch__grid_size
MET=$MET,sm__warps_active.avg.pct_of_peak_sustained_active,l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum
MET=$MET,l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum
case "$PART" in
1) for K in normalized normalized_nol2 linear; do
     echo "### ncu $K" >> "$LOG"
     timeout 300 "$NCU" --clock-control none --profile-from-start off --csv --metrics "$MET" \
       python3 benchmarks/gpu_ncu.py --kind "$K" > "$OUT/ncu_$K.csv" 2>> "$LOG"
     echo "### rc=$?" >> "$LOG"
   done
   run python3 $PROF normalized,normalized_nol2,linear ;;
2) for P in 128,64,64,8 128,64,32,8 128,32,64,8 128,64,32,4 128,32,64,4 128,32,32,4 64,64,64,8 128,64,64,8,2 \
            128,64,64,8,4; do
     run ULA_TUNE_STATE=$P python3 $PROF normalized,linear
   done ;;
3) OPS=linear,normalized,normalized_nol2,gla,mlstm_sig,mlstm_exp,gsa
   F3="--sections ops --ours $OPS --peers none --rounds 3 --graph --budget-s 200"
   for S in 0 4 5; do
     run ULA_EXP_STATE_STAGES=${S/#0/} python3 benchmarks/gpu_families_vs_peers.py $F3 --out "$OUT/fam_stages$S"
     run ULA_EXP_STATE_STAGES=${S/#0/} python3 benchmarks/gpu_core_vs_peers.py \
       --shapes "2,8192,16,128,128;1,65536,16,128,128" \
       --kinds none,constant,scalar,vector --rounds 3 --graph --out "$OUT/core_stages$S"
   done
   for S in 0 4; do
     run ULA_EXP_STATE_STAGES=${S/#0/} python3 benchmarks/gpu_repeat_calls.py --ops $OPS,retention,mamba2,hgrn2 \
       --shape 3,3000,4,64,128 --calls 3 --grad
   done ;;
4) run python3 $PROF normalized,linear
   repeats linear,normalized,normalized_nol2,normalized_pos,gla,mlstm_exp 2,8192,16,128,128 3,3000,4,64,128
   run python3 benchmarks/gpu_smoke.py
   families .:new .prev:prev ;;
5) for E in X=0 ULA_EXP_STATE_BAL=1 ULA_EXP_W_ON_K=1 "ULA_EXP_STATE_BAL=1 ULA_EXP_W_ON_K=1"; do
     run $E python3 $PROF normalized,normalized_nol2
   done
   F5="--sections ops --ours normalized,linear,normalized_nol2 --peers none --rounds 3 --graph --budget-s 150"
   run python3 benchmarks/gpu_families_vs_peers.py $F5 --out "$OUT/fam_base"
   run ULA_EXP_STATE_BAL=1 ULA_EXP_W_ON_K=1 python3 benchmarks/gpu_families_vs_peers.py $F5 --out "$OUT/fam_both"
   PRE=(ULA_EXP_STATE_BAL=1 ULA_EXP_W_ON_K=1)
   repeats normalized,normalized_nol2,normalized_pos 2,8192,16,128,128 3,3000,4,64,128 ;;
6) for S in 3 4 5; do
     run ULA_TUNE_OUTPUT=64,64,128,4,$S python3 $PROF normalized,linear
     PRE=(ULA_TUNE_OUTPUT=64,64,128,4,$S)
     repeats normalized,linear 2,8192,16,128,128
   done ;;
7) for P in 128,64,64,8,4 128,64,64,4,4 128,64,64,4,3 64,64,64,4,4; do
     run ULA_TUNE_STATE=$P python3 $PROF normalized,linear
   done ;;
8) run python3 $PROF normalized,linear
   repeats normalized,normalized_nol2,normalized_pos 2,8192,16,128,128 3,3000,4,64,128 2,4096,8,256,256
   run python3 benchmarks/gpu_smoke.py --parts ones,families,repeat
   families .:new .prev:prev ;;
9) repeats normalized,normalized_nol2 2,8192,16,128,128
   families .:new .prev:prev ;;
10) for P in 128,64,64,4,4 128,64,64,4,5 128,64,32,4,4 128,32,64,4,4; do
     run ULA_TUNE_STATE=$P python3 $PROF normalized
   done ;;
esac
echo "### done" >> "$LOG"
