#!/bin/bash
# Session 44's GPU calls (run from the repository root with $OUT set):
#     bash benchmarks/gpu_pending_session44.sh 1   # one GPU: session 43's 4-warp entry kernels end to end, against
#                                                  # 8 warps (ULA_ENTRY_TUNE=4,8,8, the tree before): one GPU's
#                                                  # time split (gpu_time_split.py, S = 1 and the default)
#     bash benchmarks/gpu_pending_session44.sh 2   # the same for the two mLSTMs at B1 T65536 H16
#                                                  # (gpu_families_vs_peers.py --graph)
#     bash benchmarks/gpu_pending_session44.sh 3   # the GPU suite
#     bash benchmarks/gpu_pending_session44.sh 4   # mLSTMexp's state calls split from 2 segments (state.segments with
#                                                  # the column of ones) against no split (ULA_STATE_SPLIT=1, the tree
#                                                  # before) at B1 H16 T 32768..131072 and B2 T8192 H16 (no split
#                                                  # there: unchanged), graph replays; repeated calls bitwise the same
#     bash benchmarks/gpu_pending_session44.sh 5   # (run before part 4, on its tree) ordered profiles of the two
#                                                  # mLSTMs, then state-kernel sweeps (tiles, stages, forced segments)
#                                                  # printing each state call's time; on part 4's tree and later the
#                                                  # default rows of mLSTMexp at B1 H16 split (ULA_STATE_SPLIT=1: not)
#     bash benchmarks/gpu_pending_session44.sh 6   # the column of ones in a program of its own (ULA_COLUMN_PROGRAM=1)
#                                                  # against the V tiles' programs carrying it (=0): each state call
#                                                  # (gpu_state_calls.py), the two mLSTMs by graph replays at B2 T8192
#                                                  # and B1 T65536 H16, repeated calls and errors against float64;
#                                                  # a trial not kept: first `git apply
#                                                  # benchmarks/results/column_program_trial_session44.patch`
# Writes $OUT/pending44.log, and $OUT/{ts,fam}_{w8,w4}*/, $OUT/split_{off,on}_*/ (each run's JSON).
NAME=pending44
source "$(dirname "$0")/gpu_pending_common.sh"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}
TS=(python3 benchmarks/gpu_time_split.py --shapes "1,32768,16,128,128;1,65536,16,128,128" --kinds constant,scalar
    --segments 1,auto)
FB=(python3 benchmarks/gpu_families_vs_peers.py --sections ops --ours mlstm_exp,mlstm_sig --peers none --graph
    --rounds 2 --shape 1,65536,16,128,128 --budget-s 100)
case "$PART" in
1) for round in 1 2; do  # two rounds, each setting in turn, so that a drift of the clock shows as a drift
     TMO=140 run ULA_ENTRY_TUNE=4,8,8 "${TS[@]}" --out "$OUT/ts_w8_$round"
     TMO=140 run "${TS[@]}" --out "$OUT/ts_w4_$round" $([ $round = 1 ] && echo --errors)
   done ;;
2) TMO=130 run ULA_ENTRY_TUNE=4,8,8 "${FB[@]}" --out "$OUT/fam_w8"
   TMO=130 run "${FB[@]}" --out "$OUT/fam_w4" ;;
3) TMO=330 run ULA_TEST_GPU=1 python3 -m pytest -q -n 12 -p no:cacheprovider tests -rfE ;;
4) for sh in 1,32768,16,128,128 1,65536,16,128,128 1,131072,16,128,128 2,8192,16,128,128; do
     FS=(python3 benchmarks/gpu_families_vs_peers.py --sections ops --ours mlstm_exp --peers none --graph --rounds 2
         --shape $sh --budget-s 100)
     TMO=100 run ULA_STATE_SPLIT=1 "${FS[@]}" --out "$OUT/split_off_${sh//,/_}"
     TMO=100 run "${FS[@]}" --out "$OUT/split_on_${sh//,/_}"
   done
   repeats mlstm_exp 1,65536,16,128,128 1,32768,16,64,64 ;;
5) P=(python3 benchmarks/gpu_profile.py --ordered)
   "${P[@]}" --kinds mlstm_exp,mlstm_sig --shape 1,65536,16,128,128 > "$OUT/profile_mlstm_long_h200_session44.txt" 2>&1
   "${P[@]}" --kinds mlstm_exp,mlstm_sig --shape 2,8192,16,128,128 > "$OUT/profile_mlstm_std_h200_session44.txt" 2>&1
   ULA_TIME_SPLIT=1 "${P[@]}" --kinds mlstm_sig,scalar --shape 1,65536,16,128,128 \
       > "$OUT/profile_mlstm_sig_nosplit_long_h200_session44.txt" 2>&1
   sweep() {  # sweep KINDS SHAPES ENV...: each state call's time per setting
     local kinds=$1 shapes=$2; shift 2
     for sh in $shapes; do for e in "$@"; do
       echo "=== $sh $e"
       env $e timeout 60 "${P[@]}" --kinds "$kinds" --shape "$sh" 2>&1 | grep -E "^== |      [0-9.]+ ms  _state_kernel"
     done; done
   }
   sweep mlstm_exp,mlstm_sig 1,65536,16,128,128 X=1 ULA_STATE_SPLIT=2 ULA_STATE_SPLIT=4 ULA_TUNE_STATE=128,32,64,8 \
       ULA_TUNE_STATE=128,64,64,8 ULA_TUNE_STATE=128,32,64,4 ULA_TUNE_STATE=128,32,32,4 ULA_TUNE_STATE=64,32,64,4 \
       ULA_TUNE_STATE=128,32,128,8 ULA_TUNE_STATE=128,32,64,8,2 ULA_TUNE_STATE=128,32,64,8,4 \
       > "$OUT/state_sweep_mlstm_long_h200_session44.txt"
   S4=ULA_TUNE_STATE=128,32,64,8,4
   sweep mlstm_exp "2,8192,16,128,128 1,32768,16,128,128 1,16384,8,128,128 1,65536,16,128,128 1,131072,16,128,128" \
       X=1 ULA_STATE_SPLIT=2 $S4 "ULA_STATE_SPLIT=2 $S4" > "$OUT/state_sweep2_mlstm_exp_h200_session44.txt" ;;
6) for sh in 2,8192,16,128,128 1,65536,16,128,128; do
     for cp in 0 1; do
       TMO=60 run ULA_COLUMN_PROGRAM=$cp python3 benchmarks/gpu_state_calls.py --shape $sh
       TMO=100 run ULA_COLUMN_PROGRAM=$cp python3 benchmarks/gpu_families_vs_peers.py --sections ops --ours mlstm_exp \
           --peers none --graph --rounds 2 --shape $sh --budget-s 100 --out "$OUT/column_${cp}_${sh//,/_}"
     done
   done
   for cp in 0 1; do PRE=(ULA_COLUMN_PROGRAM=$cp); repeats mlstm_exp 2,8192,16,128,128 1,32768,16,128,128 3,3000,4,64,96; done ;;
esac
tail -c 11000 "$LOG"
