#!/bin/bash
# Session 23: the launch settings of the launches only normalized attention makes. From the repository root with
# $OUT set:
#     bash benchmarks/gpu_pending_session23.sh 1   # ordered profiles of normalized, normalized_nol2 and linear; then
#                                                  # normalized's at the output kernel's tiles by hand
#                                                  # (ULA_TUNE_OUTPUT=BT,BK,BV,warps[,stages]: all four output calls)
#                                                  # and the L2 pass's (ULA_TUNE_L2NORM=elements,warps)
# Writes $OUT/pending23.log (every command's output under a header, the device line, the measured files' checksums).
NAME=pending23
source "$(dirname "$0")/gpu_pending_common.sh"
case "$PART" in
1) run python3 $PROF normalized,normalized_nol2,linear
   for P in 64,64,128,8 32,64,128,4 64,32,128,4 128,64,128,8 64,64,128,4,2 32,64,128,2 32,32,128,4; do
     run ULA_TUNE_OUTPUT=$P python3 $PROF normalized,linear
   done
   for P in 8192,4 32768,8 16384,16 4096,2 65536,16; do
     run ULA_TUNE_L2NORM=$P python3 $PROF normalized
   done ;;
esac
echo "### done" >> "$LOG"
