#!/bin/bash
# Session 35's GPU calls: the checks of session 34's final tree, whose last changes were CPU-tested only.
# Part 1: the capture tests, the GPU suite, the smoke's repeat part; packed ula.abc eagerly, this tree against the
#   tree before its one-scan softmax (.prev = 604b725^, with this tree's gpu_packed_layers.py copied in).
# Part 2: after part 1's fixes, the capture tests and packed ABC again; the compile checks (graphs, ops).
# Part 3: compiled against eager (wall time and graph replays); `ula train --compile` (inductor) against eager.
# Part 4 (for the next session; not run in session 35): the final tree (mLSTMexp's PyTorch scan without padding,
#   CPU-tested only): the GPU suite, the smoke, the compile checks with gradients under reduce-overhead, and the
#   finding reduced to plain PyTorch (gpu_graph_trees_version_repro.py).
#   Part 5 is part 4's second half: the compile checks and the repro.
# Run: OUT=... bash benchmarks/gpu_pending_session35.sh 1|2|3|4|5
NAME=pending35
. benchmarks/gpu_pending_common.sh
export PYTHONPATH=.
if [ "$PART" = 1 ]; then
  TMO=120 run ULA_TEST_GPU=1 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_graph_layouts.py -rfE
  TMO=240 run ULA_TEST_GPU=1 python3 -m pytest -q -n 8 -p no:cacheprovider tests -rfE
  TMO=90 run python3 benchmarks/gpu_smoke.py --parts repeat
  for t in . .prev; do  # packed ABC (m = 64), 4 layers, two packings
    TMO=45 run python3 $t/benchmarks/gpu_packed_layers.py --ops abc --shapes "4096+12288+16384,8;2048x8,16" \
        --out "packed_abc_${t#.}.json"
  done
fi
if [ "$PART" = 2 ]; then  # after part 1's fixes (chunk_torch's bounds through cu_cache; ABC's spread in w's dtype)
  TMO=120 run ULA_TEST_GPU=1 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_graph_layouts.py -rfE
  TMO=45 run python3 benchmarks/gpu_packed_layers.py --ops abc --shapes "4096+12288+16384,8;2048x8,16" \
      --out packed_abc_part2.json
  TMO=280 run python3 benchmarks/gpu_compile_checks.py --parts graphs,ops
fi
if [ "$PART" = 3 ]; then  # compiled against eager; ula train --compile (inductor) against eager, 40 steps each
  TMO=200 run python3 benchmarks/gpu_compile_speed.py
  for m in gla mlstm_exp normalized; do
    TMO=60 run python3 -m ula train --mixer $m --steps 40 --eval-every 40 --out "$OUT/train_$m"
    TMO=80 run python3 -m ula train --mixer $m --steps 40 --eval-every 40 --compile --out "$OUT/train_${m}_compiled"
  done
fi
if [ "$PART" = 4 ]; then
  TMO=240 run ULA_TEST_GPU=1 python3 -m pytest -q -n 8 -p no:cacheprovider tests -rfE
  TMO=90 run python3 benchmarks/gpu_smoke.py --parts repeat
fi
if [ "$PART" = 5 ]; then  # part 4's second half (one call holds 600 s at most)
  TMO=250 run PYTHONPATH=.:benchmarks python3 benchmarks/gpu_compile_checks.py --parts graphs
  TMO=60 run python3 benchmarks/gpu_graph_trees_version_repro.py
fi
tail -c 11000 "$LOG"
