#!/bin/bash
# Session 13's GPU measurements (H100, ours only unless said), from the repository root with $OUT set. Parts 1 and 2
# ran on the tree before the named precision settings (ula/core/precision.py), with study switches that map one to
# one onto its parts (ULA_GLA_STUDY: st=F -> states_forward, st=FRG -> states_forward + states_backward, sq=kv ->
# q_states_backward, hilo=fqkv -> split_keys; ULA_OWN_PRECISION=tf32 -> own_block); they are written here with the
# parts (ULA_PRECISION), which the final tree's runs showed give the same numbers bitwise.
#     bash benchmarks/gpu_pending_session13.sh 1   # gate-scan tiles, constant decay's forward state kernel in tf32
#                                                  # (graph-replay time), GSA under GLA's precision study set, GLA's
#                                                  # study set's bf16 error beside fla's in one run
#     bash benchmarks/gpu_pending_session13.sh 2   # gate-scan tiles (again: capture fixed), GLA's and GSA's precision
#                                                  # switches one subset at a time, error and time
#     bash benchmarks/gpu_pending_session13.sh 3   # the final tree: smoke, each op's default precision's error (ours:
#                                                  # the same numbers as parts 1-2 where the parts match), our families
#                                                  # and core kinds (eager and graph replays), first calls
#     bash benchmarks/gpu_pending_session13.sh 4   # GLA and GSA against fla chunk_gla, same run, 3 rounds
#     bash benchmarks/gpu_pending_session13.sh 5   # GSA and GLA against fla chunk_gsa, same run, 2 rounds
# Writes $OUT/pending13.log (every command's output under a header, the device line, the measured files' checksums).
NAME=pending13
source "$(dirname "$0")/gpu_pending_common.sh"
if [ "$PART" = 1 ]; then
run python3 benchmarks/gpu_gate_tiles.py --sequential
for E in "ULA_PRECISION=fast" "ULA_PRECISION=states_forward"; do
    run $E python3 benchmarks/gpu_core_vs_peers.py --shapes 2,8192,16,128,128 --kinds constant,none,scalar --rounds 3 \
        --graph --out /tmp/core
done
run ULA_PRECISION=accurate python3 benchmarks/gpu_gsa_variants.py --variants default
TMO=400 run ULA_PRECISION=accurate python3 benchmarks/gpu_hardening.py --sections quality --q-ops gla --budget-s 380 \
    --out "$OUT"
fi
if [ "$PART" = 2 ]; then
run python3 benchmarks/gpu_gate_tiles.py --sequential
# GLA's precision parts one subset at a time (with own_block): error (ours only: fla's are in part 1's quality run,
# same inputs) and time, and GSA's (which takes the same per-feature kernels)
for S in states_forward,states_backward q_states_backward split_keys states_forward,states_backward,q_states_backward \
         states_forward,states_backward,split_keys q_states_backward,split_keys states_forward,q_states_backward,split_keys; do
    E="ULA_PRECISION=own_block,$S"
    run $E python3 benchmarks/gpu_hardening.py --sections quality --q-ops gla --budget-s 30 --out /tmp/gla
    run $E python3 benchmarks/gpu_families_vs_peers.py --sections ops --ours gla --peers none --rounds 3 --graph \
        --budget-s 60 --out /tmp/gla
    run $E python3 benchmarks/gpu_gsa_variants.py --variants default
done
fi
if [ "$PART" = 3 ]; then
run python3 benchmarks/gpu_smoke.py --parts ones,families
run python3 benchmarks/gpu_hardening.py --sections quality --q-ops gla,constant --budget-s 40 --out "$OUT/quality"
run python3 benchmarks/gpu_gsa_variants.py --variants default,fast,accurate
mkdir -p "$OUT/fam"
run python3 benchmarks/gpu_families_vs_peers.py --sections ops --ours linear,normalized,mlstm_sig,mlstm_exp,gla,gsa \
    --peers none --rounds 3 --graph --budget-s 200 --out "$OUT/fam"
run python3 benchmarks/gpu_core_vs_peers.py --shapes 2,8192,16,128,128 --kinds constant,none,scalar,vector --rounds 3 \
    --graph --out "$OUT/core"
TMO=200 run python3 benchmarks/gpu_first_call.py --ops mlstm_exp,gla
fi
if [ "$PART" = 4 ]; then
mkdir -p "$OUT/gla"
TMO=590 run python3 benchmarks/gpu_families_vs_peers.py --sections ops,peers --ours gla,gsa --peers fla_gla --rounds 3 \
    --graph --budget-s 540 --out "$OUT/gla"
fi
if [ "$PART" = 5 ]; then
mkdir -p "$OUT/gsa"
TMO=590 run python3 benchmarks/gpu_families_vs_peers.py --sections ops,peers --ours gsa,gla --peers fla_gsa --rounds 2 \
    --graph --budget-s 540 --out "$OUT/gsa"
fi
echo "### done" >> "$LOG"
