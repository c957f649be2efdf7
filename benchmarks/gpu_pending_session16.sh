#!/bin/bash
# What session 15 changed after its device time ran out, to measure, from the repository root with $OUT set.
#     bash benchmarks/gpu_pending_session16.sh 1   # the ones' dQ and dK passes at 1 stage too (the forward was
#                                                  # checked in session 15): repeated calls bitwise the same at
#                                                  # several shapes, forward and gradients; smoke; the state/output
#                                                  # calls' times; the normalized epilogue end to end and its tile
#                                                  # sweep (its chunk and tiles were never kept); our families
#                                                  # (mLSTMexp / mLSTMsig, normalized / linear), graph replays
#     bash benchmarks/gpu_pending_session16.sh 2   # GSA with pass 2 at chunk 64 (the default now) against 128:
#                                                  # error and time; then GSA and GLA against fla chunk_gsa in one run
#     bash benchmarks/gpu_pending_session16.sh 3   # (session 16, on commit 7897c4a, reverted after it: no gain) the
#                                                  # ones' backward without the recompute of the normalizer's
#                                                  # borders where no decay gradient reads them: smoke, repeated
#                                                  # calls, the state calls, our families (graph replays)
#     bash benchmarks/gpu_pending_session16.sh 4   # bf16 error against float64 of GSA (the default now) and fla
#                                                  # chunk_gsa on the same inputs: issue 8's table, in one file
# Writes $OUT/pending16.log (every command's output under a header, the device line, the measured files' checksums).
NAME=pending16
source "$(dirname "$0")/gpu_pending_common.sh"
if [ "$PART" = 1 ]; then
run python3 benchmarks/gpu_smoke.py --parts ones,families,repeat
for SH in 2,8192,16,128,128 2,8192,16,64,64 2,4096,8,256,256 3,3000,4,64,128 4,2048,32,32,32; do
    run python3 benchmarks/gpu_repeat_calls.py --ops normalized,mlstm_exp --shape $SH --calls 3 --grad
done
run python3 benchmarks/gpu_state_calls.py
run python3 benchmarks/gpu_normalized_epilogue.py
run python3 benchmarks/gpu_normalized_epilogue.py --sweep
run python3 benchmarks/gpu_families_vs_peers.py --sections ops --peers none --rounds 3 --graph --budget-s 150 \
    --out "$OUT/fam"
fi
if [ "$PART" = 2 ]; then
run python3 benchmarks/gpu_gsa_variants.py --variants default,c128p2
TMO=595 run python3 benchmarks/gpu_families_vs_peers.py --sections ops,peers --ours gsa,gla --peers fla_gsa --rounds 2 \
    --graph --budget-s 570 --out "$OUT/gsa"
fi
if [ "$PART" = 3 ]; then
run python3 benchmarks/gpu_smoke.py --parts ones,families,repeat
for SH in 2,8192,16,128,128 3,3000,4,64,128; do
    run python3 benchmarks/gpu_repeat_calls.py --ops normalized,mlstm_exp --shape $SH --calls 3 --grad
done
run python3 benchmarks/gpu_state_calls.py
run python3 benchmarks/gpu_families_vs_peers.py --sections ops --ours normalized,linear,normalized_nol2,mlstm_exp,mlstm_sig \
    --peers none --rounds 3 --graph --budget-s 150 --out "$OUT/fam"
fi
if [ "$PART" = 4 ]; then
TMO=595 run python3 benchmarks/gpu_hardening.py --sections quality --q-ops gsa --fla-gsa --budget-s 575 \
    --fla-first-call-s 120 --out "$OUT/quality"
fi
echo "### done" >> "$LOG"
