#!/bin/bash
# Session 21: normalized attention toward 1.2x our linear attention. From the repository root with $OUT set:
#     bash benchmarks/gpu_pending_session21.sh 1   # (the backward's forward-states call on a side stream, beside the
#                                                  # division's backward kernel) ordered profile, graph replays with
#                                                  # the division kernel's tiles (ULA_TUNE_DIVISION_BACKWARD), smoke,
#                                                  # repeated calls, graph replays of .prev (git archive of ef621de)
#                                                  # (a trial, not kept: results/session21_side_stream_trial.patch)
#     bash benchmarks/gpu_pending_session21.sh 2   # (a trial, not kept: results/session21_dq_division_trial.patch)
#                                                  # (the division's backward formed by the dQ pass: no division
#                                                  # kernel, the state-gradient call without the column of ones) ordered
#                                                  # profiles, smoke, repeated calls at four shapes, bf16 error, graph
#                                                  # replays of this tree and .prev (ef621de)
#     bash benchmarks/gpu_pending_session21.sh 3   # (a trial, not kept; RESULTS.md session 21 describes it)
#                                                  # (the division's backward kernel with a program per block of rows,
#                                                  # not per chunk) ordered profiles at its tiles
#                                                  # (ULA_TUNE_DIVISION_BACKWARD), smoke, repeated calls at four shapes,
#                                                  # bf16 error, graph replays of this tree and .prev (ef621de)
# Writes $OUT/pending21.log (every command's output under a header, the device line, the measured files' checksums).
NAME=pending21
source "$(dirname "$0")/gpu_pending_common.sh"
FAM1="--sections ops --ours normalized,linear --peers none --rounds 3 --graph --budget-s 100"
case "$PART" in
1) run python3 $PROF normalized,linear
   for P in 8192,4 4096,4 2048,2 2048,4; do
     run ULA_TUNE_DIVISION_BACKWARD=$P python3 benchmarks/gpu_families_vs_peers.py $FAM1 --out "$OUT/fam_tile_${P/,/_}"
   done
   run python3 benchmarks/gpu_smoke.py --parts ones,families,repeat
   repeats normalized,normalized_pos 2,8192,16,128,128 3,3000,4,64,128
   families .:new .prev:prev ;;
2) run python3 $PROF normalized,normalized_nol2,linear
   normalized_checks ;;
3) run python3 $PROF normalized,normalized_nol2,linear
   for P in 4096,4 4096,2 2048,2 8192,8 16384,8 2048,4; do
     run ULA_TUNE_DIVISION_BACKWARD=$P python3 $PROF normalized
   done
   normalized_checks ;;
esac
echo "### done" >> "$LOG"
