#!/usr/bin/env bash
# The AVX-512 q8 matvec (src/cpp/cpu/matvec_q8_avx512.cpp; KERNEL=canon: the
# canonical f32 one, matvec_avx512.cpp) at two revisions, timed alternating in
# one process (cpu_kernel_ab.cpp): what a kernel change is worth on this
# machine, free of the drift between runs.
#
#   bench/experiments/cpu_kernel_ab.sh REV_A [REV_B|worktree] [REPS TYPE THREADS H V TOKENS]
#   e.g. bench/experiments/cpu_kernel_ab.sh HEAD~1 worktree 9 Q5_K 2 6656 202048 1,2,4,8,16
#
# Builds the CPU engine (build/exp-kernel-ab) and both kernel sources with the
# flags CMakeLists.txt gives *_avx512.cpp.
set -euo pipefail
cd "$(dirname "$0")/../.."
rev_a=${1:?REV_A}
rev_b=${2:-worktree}
shift $(( $# >= 2 ? 2 : 1 ))
args=("${@:-}")
[ $# -eq 6 ] || args=(9 Q5_K 2 6656 202048 1,8)
out=build/exp-kernel-ab
mkdir -p "$out"
cmake -S . -B "$out" -DCMAKE_BUILD_TYPE=Release -DMUSER_BUILD_PYTHON=OFF -DMUSER_BUILD_CUDA=OFF -DMUSER_BUILD_TESTS=OFF > "$out/cmake.log"
cmake --build "$out" --target muser_engine -j "$(nproc)" > "$out/build.log"
if [ "${KERNEL:-q8}" = canon ]; then
  src=src/cpp/cpu/matvec_avx512.cpp entry=matvec_canon_avx512 extra=(-DMUSER_AB_CANON -mavx512vbmi)
else
  src=src/cpp/cpu/matvec_q8_avx512.cpp entry=matvec_q8_avx512 extra=()
fi
git show "$rev_a:$src" > "$out/kernel_a.cpp"
if [ "$rev_b" = worktree ]; then cp "$src" "$out/kernel_b.cpp"; else git show "$rev_b:$src" > "$out/kernel_b.cpp"; fi
flags=(-O3 -DNDEBUG -std=c++17 -DMUSER_X86=1 -Isrc/cpp -pthread)
isa=(-mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni -mavx2 -mfma -mf16c -mbmi2)
for s in a b; do
  g++ "${flags[@]}" "${isa[@]}" "${extra[@]}" -D$entry=matvec_ab_$s -c "$out/kernel_$s.cpp" -o "$out/kernel_$s.o"
done
g++ "${flags[@]}" "${extra[@]}" bench/experiments/cpu_kernel_ab.cpp "$out"/kernel_a.o "$out"/kernel_b.o "$out/libmuser_engine.a" \
  -o "$out/ab"
echo "$src: A = $rev_a, B = $rev_b; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
"$out/ab" "${args[@]}"
