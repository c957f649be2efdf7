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
PRE=()
