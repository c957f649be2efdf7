#!/usr/bin/env bash
# A Triton release small enough for one device call (whose working tree travels at most 64 MiB, and the wheels are
# 150-290 MB): the wheel's files without what ula's kernels never touch on a Hopper GPU (the profiler's CUPTI
# libraries, instrumentation, proton, the disassemblers, FileCheck, the AMD backend's libraries, and the one of
# ptxas / ptxas-blackwell that this release does not use for sm_90), libtriton.so stripped of its symbols, packed
# with xz. Usage: bash benchmarks/slim_triton.sh VERSION [DIR] -> DIR/triton-VERSION-slim.tar.xz (DIR default .tw,
# which .git/info/exclude should ignore). On the device benchmarks/gpu_triton_versions.sh unpacks it.
set -euo pipefail
v=$1
dir=${2:-.tw}
VPY=${VPY:-.venv/bin/python}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$VPY" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_27_x86_64 --platform manylinux_2_28_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$work/whl" "triton==$v"
mkdir -p "$work/$v" "$dir"
(cd "$work/$v" && unzip -q "$work"/whl/triton-*.whl)
t="$work/$v/triton"
rm -rf "$t"/backends/nvidia/lib/cupti* "$t/instrumentation" "$t/_C/libproton.so" "$t/profiler" "$t/FileCheck" \
  "$t/backends/nvidia/bin/nvdisasm" "$t/backends/nvidia/bin/cuobjdump" "$t/backends/amd/lib"
if grep -q "if arch < 90" "$t/backends/nvidia/compiler.py"; then  # 3.9: Hopper takes ptxas-blackwell
  rm -f "$t/backends/nvidia/bin/ptxas"
else
  rm -f "$t/backends/nvidia/bin/ptxas-blackwell"
fi
strip --strip-unneeded "$t/_C/libtriton.so"
tar -C "$work" -cf - "$v" | xz -6 -T2 > "$dir/triton-$v-slim.tar.xz"
ls -la "$dir/triton-$v-slim.tar.xz"
