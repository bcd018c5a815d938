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
# compile command CMake gives the kernel file (compile_commands.json).
set -euo pipefail
cd "$(dirname "$0")/../.."
usage="usage: $0 REV_A [REV_B|worktree] [REPS TYPE THREADS H V TOKENS]"
rev_a=${1:?$usage}
rev_b=${2:-worktree}
shift $(( $# >= 2 ? 2 : 1 ))
if [ $# -eq 6 ]; then args=("$@"); elif [ $# -eq 0 ]; then args=(9 Q5_K 2 6656 202048 1,8); else echo "$usage" >&2; exit 2; fi
out=build/exp-kernel-ab
mkdir -p "$out"
cmake -S . -B "$out" -DCMAKE_BUILD_TYPE=Release -DMUSER_BUILD_PYTHON=OFF -DMUSER_BUILD_CUDA=OFF -DMUSER_BUILD_TESTS=OFF \
  -DCMAKE_EXPORT_COMPILE_COMMANDS=ON > "$out/cmake.log"
cmake --build "$out" --target muser_engine -j "$(nproc)" > "$out/build.log"
if [ "${KERNEL:-q8}" = canon ]; then
  src=src/cpp/cpu/matvec_avx512.cpp entry=matvec_canon_avx512 harness_def=-DMUSER_AB_CANON
else
  src=src/cpp/cpu/matvec_q8_avx512.cpp entry=matvec_q8_avx512 harness_def=
fi
git show "$rev_a:$src" > "$out/kernel_a.cpp"
if [ "$rev_b" = worktree ]; then cp "$src" "$out/kernel_b.cpp"; else git show "$rev_b:$src" > "$out/kernel_b.cpp"; fi
# the engine's own compile command for the kernel, with the copy in, the object out and the entry renamed
for s in a b; do
  python3 - "$out/compile_commands.json" "$PWD/$src" "$PWD/$out/kernel_$s.cpp" "$PWD/$out/kernel_$s.o" "-D$entry=matvec_ab_$s" <<'PY'
import json, shlex, subprocess, sys
db, src, copy, obj, define = sys.argv[1:]
entry = next(e for e in json.load(open(db)) if e["file"] == src)
args = shlex.split(entry["command"])
args[args.index("-o") + 1] = obj
args[args.index(src)] = copy
subprocess.run(args[:1] + [define] + args[1:], cwd=entry["directory"], check=True)
PY
done
g++ -O3 -DNDEBUG -std=c++17 -DMUSER_X86=1 -Isrc/cpp -pthread $harness_def bench/experiments/cpu_kernel_ab.cpp \
  "$out"/kernel_a.o "$out"/kernel_b.o "$out/libmuser_engine.a" -o "$out/ab"
echo "$src: A = $rev_a, B = $rev_b; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
"$out/ab" "${args[@]}"
