# Session 26: ula's kernels on the GPU under Triton releases other than the machine's own, carried as slim tarballs
# (benchmarks/slim_triton.sh -> .tw*/triton-V-slim.tar.xz, the folder named in carry). Arguments: steps TAG:WHAT in
# order, TAG "own" (the machine's Triton) or a carried version, WHAT "smoke" (benchmarks/gpu_smoke.py: bf16 forward
# and gradients against float64 for every decay kind and family, the decoding step; SMOKE_PARTS, SMOKE_S) or
# "families" (the families timed, graph replays, two rounds; FAM_S). OUT, TREE set. Log: $OUT/triton_versions.log.
#   e.g. TREE=abc1234 bash benchmarks/gpu_triton_versions.sh 3.9.0:families own:families 3.9.0:smoke
export PYTHONUNBUFFERED=1 OUT=${OUT:-/tmp/o}
L=$OUT/triton_versions.log
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> $L
echo "tree ${TREE:-unknown}; steps: $*" >> $L
for step in "$@"; do
  tag=${step%%:*}; what=${step#*:}
  if [ "$tag" = own ]; then unset PYTHONPATH; else
    if [ ! -d /tmp/t/$tag ]; then mkdir -p /tmp/t; tar -xJf .tw*/triton-$tag-slim.tar.xz -C /tmp/t || exit 1; fi
    export PYTHONPATH=/tmp/t/$tag; fi
  ver=$(python3 -c 'import torch, triton as t; print("triton", t.__version__, t.__file__, "torch", torch.__version__)' \
    2>&1)
  echo "### $tag $what: $ver" >> $L
  s=$SECONDS
  if [ "$what" = smoke ]; then
    timeout ${SMOKE_S:-280} python3 benchmarks/gpu_smoke.py ${SMOKE_PARTS:+--parts $SMOKE_PARTS} >> $L 2>&1
  else
    mkdir -p $OUT/fam_$tag
    timeout ${FAM_S:-120} python3 benchmarks/gpu_families_vs_peers.py --sections ops --peers none --rounds 2 --graph \
      --budget-s $((${FAM_S:-120} - 10)) --ours gla,mlstm_sig,mlstm_exp,gsa,normalized,linear \
      --out $OUT/fam_$tag >> $L 2>&1
  fi
  echo "$tag $what rc=$? ($((SECONDS - s)) s)" >> $L
done
grep -E "^(NVIDIA|tree|###)| rc=|BAD|FAIL|Error|error" $L | head -60
