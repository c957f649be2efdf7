#!/bin/bash
# Session 20: normalized attention toward 1.2x our linear attention. From the repository root with $OUT set:
#     bash benchmarks/gpu_pending_session20.sh 1   # (the sums of v in the forward's state call, the pass before the
#                                                  # forward only the L2 norm of q and k, one launch) ordered profiles,
#                                                  # the norm's tiles (ULA_TUNE_L2NORM), smoke, repeated calls at four
#                                                  # shapes, bf16 error, graph replays of this tree and .prev (git
#                                                  # archive of commit a29f64d)
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
esac
echo "### done" >> "$LOG"
