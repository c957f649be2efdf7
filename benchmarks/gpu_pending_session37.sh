#!/bin/bash
# Session 37's GPU calls. (Session 36's part 8, the first timing of ABC's three-launch softmax, ran at the start:
# results/pending36_h100_session37_part8.log; its run of .prev compiled hit the graph that this tree's run had put
# in Inductor's FX graph cache, hence each tree's own cache below.)
# Part 1: ABC's op with its tiles as an argument: the GPU tests, the compile checks, ABC eager and compiled on this
#   tree and on .prev = 4dc0652 (the walk; this tree's gpu_compile_speed.py copied in), each tree on its own cache.
# Part 2: the GPU suite and the smoke's repeat part on this tree.
# Part 3: the softmax's backward from φ (b = 1 − φ_next, no recomputed pairs): GPU tests, the softmax's tiles, ABC's
#   ordered profile (f+b, peak memory) on this tree and on .prev = 67966d0 (the backward recomputing the pairs).
# Part 4: the same two trees: ABC f+b eager and compiled (graph replays), each tree on its own Inductor cache; the
#   compile checks' graphs part for ABC on this tree.
# Run: OUT=... bash benchmarks/gpu_pending_session37.sh 1|2|3|4
NAME=pending37
. benchmarks/gpu_pending_common.sh
export PYTHONPATH=.
if [ "$PART" = 1 ]; then
  TMO=100 run ULA_TEST_GPU=1 python3 -m pytest -q -p no:cacheprovider tests/test_abc_softmax_kernels.py \
      tests/test_extreme.py -k "abc or softmax" -rfE
  TMO=120 run PYTHONPATH=.:benchmarks python3 benchmarks/gpu_compile_checks.py --parts graphs --graph-steps abc
  for t in . .prev; do
    TMO=150 run TORCHINDUCTOR_CACHE_DIR="/tmp/inductor_tree${t#.}" PYTHONPATH=$t \
        python3 $t/benchmarks/gpu_compile_speed.py abc
  done
fi
if [ "$PART" = 2 ]; then
  TMO=240 run ULA_TEST_GPU=1 python3 -m pytest -q -n 8 -p no:cacheprovider tests -rfE
  TMO=90 run python3 benchmarks/gpu_smoke.py --parts repeat
fi
if [ "$PART" = 3 ]; then
  TMO=100 run ULA_TEST_GPU=1 python3 -m pytest -q -p no:cacheprovider tests/test_abc_softmax_kernels.py \
      tests/test_extreme.py -k "abc or softmax" -rfE
  TMO=60 run python3 benchmarks/gpu_abc_softmax_tiles.py --tiles "32,16,1,256;64,16,2,256;32,32,2,256;64,16,4,256"
  TMO=40 run PYTHONPATH=.prev python3 .prev/benchmarks/gpu_abc_softmax_tiles.py --tiles "32,16,1,256"
  for t in . .prev; do TMO=60 run PYTHONPATH=$t python3 $t/benchmarks/gpu_profile.py --kinds abc,gsa; done
fi
if [ "$PART" = 4 ]; then
  for t in . .prev; do
    TMO=100 run TORCHINDUCTOR_CACHE_DIR="/tmp/inductor_tree${t#.}" PYTHONPATH=$t \
        python3 $t/benchmarks/gpu_compile_speed.py abc
  done
  TMO=120 run PYTHONPATH=.:benchmarks python3 benchmarks/gpu_compile_checks.py --parts graphs --graph-steps abc
fi
tail -c 11000 "$LOG"
