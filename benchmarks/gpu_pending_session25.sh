#!/bin/bash
# Session 25: every bar of issue 4 measured on one tree, ours and the peers in the same call, B2 T8192 H16 K=V=128,
# bf16, graph replays beside eager medians. From the repository root with $OUT set and the peers' wheels installed
# on PYTHONPATH (benchmarks/README or ../shared/peers/README.md: .whl carried, pip install --target /tmp/site):
#     bash benchmarks/gpu_pending_session25.sh 1   # GLA, mLSTMsig, mLSTMexp, normalized, linear against TFLA (sig,
#                                                  # sig without its normalizer, exp) and fla chunk_gla, two rounds
#     bash benchmarks/gpu_pending_session25.sh 2   # normalized against fla chunk_linear_attn(normalize=True): time,
#                                                  # memory over T up to 131072; TFLA's trade-off plot for mLSTMsig
#     bash benchmarks/gpu_pending_session25.sh 3   # GSA (m=64) and GLA against fla chunk_gsa, two rounds
#     bash benchmarks/gpu_pending_session25.sh 4   # other shapes, one round: B2 T8192 H32 K=V=64 (part 4) and B1
#     bash benchmarks/gpu_pending_session25.sh 5   # T32768 H16 K=V=128 (part 5), ours against TFLA, fla chunk_gla
#                                                  # and fla chunk_linear_attn(normalize=True)
# Writes $OUT/pending25.log (every command's output under a header, the device line, the measured files' checksums)
# and each part's $OUT/fam{1,2,3}/gpu_families_vs_peers.json.
NAME=pending25
source "$(dirname "$0")/gpu_pending_common.sh"
FVP="python3 benchmarks/gpu_families_vs_peers.py --graph --budget-s 570"
case "$PART" in
1) TMO=595 run $FVP --sections ops,peers --ours gla,mlstm_sig,mlstm_exp,normalized,linear \
       --peers tfla_sig,tfla_sig_nonorm,tfla_exp,fla_gla --rounds 2 --out "$OUT/fam1" ;;
2) TMO=595 run $FVP --sections ops,peers,memory,tfla --ours normalized,linear,normalized_nol2,mlstm_sig \
       --peers fla_norm --rounds 1 --out "$OUT/fam2" ;;
3) TMO=595 run $FVP --sections ops,peers --ours gsa,gla --peers fla_gsa --rounds 2 --out "$OUT/fam3" ;;
4|5) SH=$([ "$PART" = 4 ] && echo 2,8192,32,64,64 || echo 1,32768,16,128,128)
   TMO=595 run $FVP --shape $SH --sections ops,peers --ours gla,mlstm_sig,mlstm_exp,normalized,linear \
       --peers tfla_sig,fla_gla,fla_norm --rounds 1 --out "$OUT/fam$PART" ;;
esac
echo "### done" >> "$LOG"
