#!/bin/bash
# Session 15's GPU measurements, from the repository root with $OUT set.
#     bash benchmarks/gpu_pending_session15.sh 1   # the column-of-ones forward at 4 warps and 1 stage (the default
#                                                  # now): repeated calls bitwise the same at several shapes and head
#                                                  # sizes, forward and gradients; smoke; GSA's default (s in bf16)
#                                                  # against s in float32 (session 14's default)
#     bash benchmarks/gpu_pending_session15.sh 2   # every family and its peers but fla chunk_gsa in one run, 2 rounds,
#                                                  # CUDA-graph replays: the issue-4 table
#     bash benchmarks/gpu_pending_session15.sh 3   # GSA and GLA against fla chunk_gsa (its autotuning alone ~400 s)
#     bash benchmarks/gpu_pending_session15.sh 4   # bf16 error against float64, ours and fla, every shared op (the
#                                                  # budget ends before normalized and GSA: part 5)
#     bash benchmarks/gpu_pending_session15.sh 5   # the same for normalized and GSA (fla's first calls ~150 + ~300 s)
#     bash benchmarks/gpu_pending_session15.sh 6   # GSA with pass 2's split keys (the default while it ran, dropped
#                                                  # after: +0.2 ms) against without, error and time; then our
#                                                  # families and fla chunk_gsa in one run (fla skipped: budget)
# Writes $OUT/pending15.log (every command's output under a header, the device line, the measured files' checksums).
NAME=pending15
source "$(dirname "$0")/gpu_pending_common.sh"
if [ "$PART" = 1 ]; then
run python3 benchmarks/gpu_smoke.py --parts ones,families,repeat
for SH in 2,8192,16,128,128 2,8192,16,64,64 2,4096,8,256,256 1,8192,16,128,64 3,3000,4,64,128 4,2048,32,32,32; do
    run python3 benchmarks/gpu_repeat_calls.py --ops normalized,mlstm_exp,mlstm_sig --shape $SH --calls 3 --grad
done
run python3 benchmarks/gpu_gsa_variants.py --variants default,s_wide
fi
if [ "$PART" = 2 ]; then
TMO=595 run python3 benchmarks/gpu_families_vs_peers.py --sections ops,peers \
    --peers tfla_sig,tfla_sig_nonorm,fla_gla,fla_norm --rounds 2 --graph --budget-s 570 --out "$OUT/fam"
fi
if [ "$PART" = 3 ]; then
TMO=595 run python3 benchmarks/gpu_families_vs_peers.py --sections ops,peers --ours gsa,gla --peers fla_gsa --rounds 2 \
    --graph --budget-s 570 --out "$OUT/gsa"
fi
if [ "$PART" = 4 ]; then
TMO=590 run python3 benchmarks/gpu_hardening.py --sections quality --budget-s 560 --out "$OUT/quality"
fi
if [ "$PART" = 5 ]; then
TMO=595 run python3 benchmarks/gpu_hardening.py --sections quality --q-ops gsa,normalized_pos --fla-gsa --budget-s 575 \
    --fla-first-call-s 120 --out "$OUT/quality"
fi
if [ "$PART" = 6 ]; then
run python3 benchmarks/gpu_gsa_variants.py --variants default,p2=own_block.states_backward.q_states_backward
TMO=595 run python3 benchmarks/gpu_families_vs_peers.py --sections ops,peers --peers fla_gsa --rounds 2 --graph \
    --budget-s 420 --out "$OUT/fam"
fi
echo "### done" >> "$LOG"
