# Sourced by benchmarks/gpu_pending_session*.sh with NAME set: $OUT/$NAME.log gets the device line, the library
# versions, the measured files' checksums and the part; `run` appends one command's output under a header.
set -u
PART=${1:-1}
OUT=${OUT:-/tmp/pending}
mkdir -p "$OUT"
LOG="$OUT/$NAME.log"
run() {  # one command, its output into the log under a header with the command
    echo "### $*" >> "$LOG"
    timeout "${TMO:-300}" env "$@" >> "$LOG" 2>&1
    echo "### rc=$?" >> "$LOG"
}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> "$LOG"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> "$LOG" 2>&1
md5sum ula/core/triton/*.py ula/core/op.py ula/ops/*.py ula/core/precision.py >> "$LOG"
echo "### part $PART" >> "$LOG"
# shared by the session scripts: the ordered profile, repeated calls, graph-replay timings of carried trees
PROF="benchmarks/gpu_profile.py --ordered --kinds"
repeats() {  # repeats OPS SHAPE...: forward and gradients bitwise the same over calls (PRE: environment, may be empty)
    local ops=$1; shift
    for SH in "$@"; do run "${PRE[@]}" python3 benchmarks/gpu_repeat_calls.py --ops "$ops" --shape "$SH" --calls 3 --grad; done
}
FAM="--sections ops --ours normalized,linear,normalized_nol2 --peers none --rounds 3 --graph --budget-s 150"
families() {  # families TREE:NAME...: graph-replay timings of each tree (. this one, .base, .prev), $OUT/fam_NAME
    for t in "$@"; do run python3 "${t%%:*}"/benchmarks/gpu_families_vs_peers.py $FAM --out "$OUT/fam_${t##*:}"; done
}
normalized_checks() {  # smoke, normalized's repeated calls at four shapes, bf16 error, graph replays of . and .prev
   run python3 benchmarks/gpu_smoke.py --parts ones,families,repeat
   repeats normalized,normalized_nol2,normalized_pos 2,8192,16,128,128 3,3000,4,64,128 2,4096,8,256,256 4,2048,32,32,32
   run python3 benchmarks/gpu_hardening.py --sections quality --q-ops normalized,normalized_pos --budget-s 120 \
       --out "$OUT/quality_new"
   families .:new .prev:prev
}
PRE=()
CP="NCCL_NVLS_ENABLE=0 torchrun --standalone --nproc_per_node=2"
cp_mlstm_check() {  # cp_mlstm_check FILE: 2 GPUs, mLSTMexp's context-parallel check at T = 32768 -> $OUT/FILE
   TMO=200 run $CP benchmarks/gpu_context_parallel.py --kinds "" --families mlstm_exp,mlstm_exp_pos --grad-T 32768 \
       --T_long 0
   mv "$OUT/gpu_context_parallel.json" "$OUT/$1"
}
cp_mlstm_times() {  # cp_mlstm_times TAG...: 2 GPUs, both mLSTMs at B1 T131072, this tree and .prev in turn per TAG
   for tag in "$@"; do  # -> $OUT/cp_time_{new,prev}_TAG.json
     for t in .:new .prev:prev; do
       TMO=120 run $CP "${t%%:*}"/benchmarks/gpu_context_parallel.py --kinds mlstm_exp,mlstm_sig --T 131072 \
           --T_long 0 --reps 5
       mv "$OUT/gpu_context_parallel.json" "$OUT/cp_time_${t##*:}_$tag.json"
     done
   done
}
