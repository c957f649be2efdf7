#!/bin/bash
# Session 36's GPU calls.
# Part 1: compiled ABC against eager and float32 (session 35's part 5 found 1e-2 between compiled and eager
#   gradients); where the host's time goes in a compiled forward+backward (session 35: wall time of compiled
#   normalized and GLA 1.19-1.23x eager's at the same GPU time): host submit times and cProfile, eager and compiled.
# Part 2: the compiled call's host time split into its layers (benchmarks/gpu_compile_host.py).
# Part 3: compiled GSA and ABC take p in float32 as eager: the graphs check of ABC again, compiled speed.
# Part 4: why the core's backward costs the host more through its custom op; compiled ABC's kernels.
# Part 5: ABC's cumulative softmax on its Triton kernels: GPU tests, compiled checks, speed against the tree before.
# Part 6: the cumulative softmax kernels' tiles (gpu_abc_softmax_tiles.py); part 5's GPU tests again.
# Part 7: the same on the two-launch kernels (a program per block), ABC eager and compiled.
# Part 8 (run in session 37): the three-launch kernels, linear in T, against the sequential walk (.prev = 4dc0652).
# Run: OUT=... bash benchmarks/gpu_pending_session36.sh 1|2|3|4|5|6|7|8
NAME=pending36
. benchmarks/gpu_pending_common.sh
export PYTHONPATH=.
if [ "$PART" = 1 ]; then
  TMO=120 run PYTHONPATH=.:benchmarks python3 benchmarks/gpu_compile_checks.py --parts graphs --graph-steps abc
  TMO=150 run python3 benchmarks/gpu_host_families.py --ops linear,normalized,gla --profile
  TMO=240 run python3 benchmarks/gpu_host_families.py --ops linear,normalized,gla --profile --compile
fi
if [ "$PART" = 2 ]; then  # the compiled call's host time split into its layers (core, linear attention)
  TMO=200 run python3 benchmarks/gpu_compile_host.py
fi
if [ "$PART" = 3 ]; then  # compiled GSA and ABC with p in float32 (as eager): against eager and float32, speed
  TMO=120 run PYTHONPATH=.:benchmarks python3 benchmarks/gpu_compile_checks.py --parts graphs --graph-steps abc
  TMO=200 run python3 benchmarks/gpu_compile_speed.py gsa,abc
fi
if [ "$PART" = 4 ]; then  # the backward's custom-op cost on the host; compiled ABC's kernels
  TMO=120 run python3 benchmarks/gpu_custom_op_cost.py
  TMO=200 run python3 benchmarks/gpu_abc_compiled_profile.py
fi
if [ "$PART" = 5 ]; then  # ABC's cumulative softmax on its own kernels: GPU tests, compiled checks, eager and compiled
  # speed against the tree before (.prev = 85bcf81, this tree's gpu_compile_speed.py copied in)
  TMO=200 run ULA_TEST_GPU=1 python3 -m pytest -q -p no:cacheprovider tests/test_abc_softmax_kernels.py \
      tests/test_extreme.py -k "abc or softmax or carry or only_the_final" -rfE
  TMO=120 run PYTHONPATH=.:benchmarks python3 benchmarks/gpu_compile_checks.py --parts graphs --graph-steps abc
  for t in . .prev; do TMO=150 run PYTHONPATH=$t python3 $t/benchmarks/gpu_compile_speed.py abc,gsa; done
  TMO=120 run python3 benchmarks/gpu_abc_compiled_profile.py
fi
if [ "$PART" = 6 ]; then  # the cumulative softmax kernels' tiles; the GPU tests of part 5 again (inputs on the GPU)
  TMO=100 run ULA_TEST_GPU=1 python3 -m pytest -q -p no:cacheprovider tests/test_abc_softmax_kernels.py \
      tests/test_extreme.py -k "abc or softmax or carry or only_the_final" -rfE
  TMO=200 run python3 benchmarks/gpu_abc_softmax_tiles.py
fi
if [ "$PART" = 7 ]; then  # the cumulative softmax's two-launch kernels: GPU tests, tiles, ABC eager and compiled
  TMO=100 run ULA_TEST_GPU=1 python3 -m pytest -q -p no:cacheprovider tests/test_abc_softmax_kernels.py \
      tests/test_extreme.py -k "abc or softmax" -rfE
  TMO=100 run python3 benchmarks/gpu_abc_softmax_tiles.py
  TMO=150 run python3 benchmarks/gpu_compile_speed.py abc
fi
if [ "$PART" = 8 ]; then  # for session 37: the three-launch kernels (linear in T) against the sequential walk
  # (.prev = 4dc0652, this tree's gpu_abc_softmax_tiles.py and gpu_compile_speed.py copied in), tiles, long T
  TMO=100 run ULA_TEST_GPU=1 python3 -m pytest -q -p no:cacheprovider tests/test_abc_softmax_kernels.py \
      tests/test_extreme.py -k "abc or softmax" -rfE
  TMO=120 run python3 benchmarks/gpu_abc_softmax_tiles.py --tiles "32,16,1,256;64,16,2,256;32,32,2,256;64,8,1,256"
  TMO=100 run python3 benchmarks/gpu_abc_softmax_tiles.py --tiles "32,16,1,256" --shape 1,65536,16,64
  TMO=60 run PYTHONPATH=.prev python3 .prev/benchmarks/gpu_abc_softmax_tiles.py --tiles "64,16,4"
  for t in . .prev; do TMO=150 run PYTHONPATH=$t python3 $t/benchmarks/gpu_compile_speed.py abc; done
fi
tail -c 11000 "$LOG"
