#!/bin/bash
# Session 14's GPU measurements, written on a CPU-only session (no device time was left), from the repository root
# with $OUT set. Ours only unless said.
#     bash benchmarks/gpu_pending_session14.sh 1   # smoke (the normalized epilogue's float64 denominators compile;
#                                                  # every family twice, bitwise), GSA's handover variants: error
#                                                  # and time (default against session 13's o1_bf16+p2own), the
#                                                  # normalized epilogue alone and end to end
#     bash benchmarks/gpu_pending_session14.sh 2   # the column-of-ones forward at 4 warps with 1 and 2 pipelining
#                                                  # stages: repeat check, then the state/output calls' times and
#                                                  # the mLSTM families in graph replays
#     bash benchmarks/gpu_pending_session14.sh 3   # GSA and GLA against fla chunk_gsa, same run, 2 rounds
#     bash benchmarks/gpu_pending_session14.sh 4   # bf16 error against float64, ours and fla, every shared op
#                                                  # (normalized included: fla autotunes ~150 s)
# Writes $OUT/pending14.log (every command's output under a header, the device line, the measured files' checksums).
NAME=pending14
source "$(dirname "$0")/gpu_pending_common.sh"
if [ "$PART" = 1 ]; then
run python3 benchmarks/gpu_smoke.py --parts ones,families,repeat
run python3 benchmarks/gpu_gsa_variants.py --variants default,o1_bf16+p2own,p2own,s_bf16,c64p2,p2acc
run python3 benchmarks/gpu_normalized_epilogue.py
fi
if [ "$PART" = 2 ]; then
mkdir -p "$OUT/fam"
run python3 benchmarks/gpu_state_calls.py
for S in 1 2; do
    E="ULA_TUNE_OUTPUT=64,64,128,4,$S"
    run $E python3 benchmarks/gpu_smoke.py --parts repeat
    run $E python3 benchmarks/gpu_state_calls.py
    run $E python3 benchmarks/gpu_families_vs_peers.py --sections ops --ours mlstm_sig,mlstm_exp --peers none \
        --rounds 3 --graph --budget-s 120 --out "$OUT/fam"
done
run python3 benchmarks/gpu_families_vs_peers.py --sections ops --ours linear,normalized,mlstm_sig,mlstm_exp,gla,gsa \
    --peers none --rounds 3 --graph --budget-s 200 --out "$OUT/fam"
fi
if [ "$PART" = 3 ]; then
mkdir -p "$OUT/gsa"
TMO=590 run python3 benchmarks/gpu_families_vs_peers.py --sections ops,peers --ours gsa,gla --peers fla_gsa --rounds 2 \
    --graph --budget-s 540 --out "$OUT/gsa"
fi
if [ "$PART" = 4 ]; then
TMO=590 run python3 benchmarks/gpu_hardening.py --sections quality --budget-s 560 --out "$OUT/quality"
fi
echo "### done" >> "$LOG"
