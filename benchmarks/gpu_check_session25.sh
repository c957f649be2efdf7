# Session 25: after the audit fixes (Python-level checks), the GPU smoke, the new tests with CUDA present, and our
# families timed in one call against the tree before them (_prev = git archive 592a78e, carried). OUT, TREE set.
export PYTHONUNBUFFERED=1 OUT=${OUT:-/tmp/o}
L=$OUT/check25.log
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $L
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" >> $L
echo "tree ${TREE:-unknown} (prev: _prev, carried)" >> $L
echo "### gpu_smoke" >> $L; timeout ${SMOKE_S:-200} python3 benchmarks/gpu_smoke.py ${SMOKE_PARTS:-} >> $L 2>&1; echo "rc=$?" >> $L
echo "### pytest new tests (CUDA present)" >> $L
timeout 150 python3 -m pytest -q -x tests/test_audit_fixes_ops.py tests/test_audit_fixes_models.py tests/test_reference_backend.py -p no:cacheprovider >> $L 2>&1; echo "rc=$?" >> $L
for t in ${TREES-_prev .}; do echo "### families $t" >> $L
timeout 150 python3 $t/benchmarks/gpu_families_vs_peers.py --sections ops --peers none --rounds 2 --graph --budget-s 140 --ours gla,mlstm_sig,mlstm_exp,gsa,normalized,linear --out $OUT/fam_$(basename $t | tr . new) >> $L 2>&1; echo "rc=$?" >> $L; done
grep -E "^(NVIDIA|torch|rc=|###)|ok|FAIL|fail|passed|error" $L | head -60
