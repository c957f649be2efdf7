#!/bin/bash
# Session 28: the core split along T on one GPU (ula/core/time_split.py). From the repository root with $OUT set and
# the peers' wheels carried in .whl (../shared/peers/README.md):
#     bash benchmarks/gpu_pending_session28.sh 1   # smoke (every part), repeated calls bitwise the same on the split
#                                                  # path (B1 T32768 H16), the families against the peers at B1 T32768
#                                                  # and ours again unsplit (ULA_TIME_SPLIT=1)
#     bash benchmarks/gpu_pending_session28.sh 2   # as kept (entry tiles, minimum segments): the default split against
#                                                  # none with errors against float64, also at GLA's "accurate"
#                                                  # precision; then part 1's families again
# Writes $OUT/pending28.log (every command's output under a header, the device line, the measured files' checksums)
# and the JSON files under $OUT.
NAME=pending28
source "$(dirname "$0")/gpu_pending_common.sh"
families_b1() {  # the families at B1 T32768 H16 against the peers, and ours unsplit
   TMO=400 run python3 benchmarks/gpu_families_vs_peers.py --graph --budget-s 380 --shape 1,32768,16,128,128 \
       --sections ops,peers --ours gla,mlstm_sig,linear --peers fla_gla,tfla_sig --rounds 1 --out "$OUT/fam_b1t32768"
   TMO=200 run ULA_TIME_SPLIT=1 python3 benchmarks/gpu_families_vs_peers.py --graph --budget-s 180 \
       --shape 1,32768,16,128,128 --sections ops --ours gla,mlstm_sig,linear --peers none --rounds 1 \
       --out "$OUT/fam_b1t32768_nosplit"
}
case "$PART" in
1) run python3 benchmarks/gpu_smoke.py
   repeats gla,mlstm_sig,linear 1,32768,16,128,128
   families_b1 ;;
2) run python3 benchmarks/gpu_time_split.py --errors --segments 1,auto --out "$OUT/split_fast" \
       --shapes "1,32768,16,128,128;1,16384,8,128,128;1,8192,16,128,128;2,8192,16,128,128;1,65536,16,128,128"
   run ULA_PRECISION=accurate python3 benchmarks/gpu_time_split.py --kinds vector --segments 1,auto \
       --out "$OUT/split_accurate" --shapes "1,32768,16,128,128;1,16384,8,128,128;1,65536,16,128,128"
   families_b1 ;;
esac
echo "### done" >> "$LOG"
