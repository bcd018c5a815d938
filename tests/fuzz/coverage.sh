#!/usr/bin/env bash
# Line coverage of the engine by a fuzz corpus: the harness built with clang's
# source-based coverage (plus the fuzz build's ASan+UBSan), every corpus file
# run once, then llvm-cov's report over src/cpp.
#
#   tests/fuzz/coverage.sh [CORPUS_DIR ...]   (default: build/fuzz-work/corpus build/fuzz-corpus)
#
# Writes build/fuzz-cov/report.txt (per file) and prints its TOTAL line.
# The corpus is run once per SIMD twin named in COV_ISAS (e.g.
# "scalar avx2 avx512"; default: only the machine's best, as a fuzz run
# without MUSER_CPU_ISA uses), the profiles merged.
set -euo pipefail
cd "$(dirname "$0")/../.."
dirs=("$@")
[ ${#dirs[@]} -gt 0 ] || dirs=(build/fuzz-work/corpus build/fuzz-corpus)
out=build/fuzz-cov
cov="-fprofile-instr-generate -fcoverage-mapping"
cmake -S . -B "$out" -DMUSER_FUZZ=ON -DMUSER_BUILD_PYTHON=OFF -DMUSER_BUILD_CUDA=OFF -DCMAKE_BUILD_TYPE=Debug \
      -DCMAKE_CXX_COMPILER="${CXX_FUZZ:-clang++}" -DCMAKE_CXX_FLAGS="$cov" \
      -DCMAKE_EXE_LINKER_FLAGS="-fprofile-instr-generate" > /dev/null
cmake --build "$out" -j "$(nproc 2>/dev/null || echo 2)" --target muser_fuzz_gguf > /dev/null
rm -f "$out"/*.profraw
for isa in ${COV_ISAS:-default}; do
  [ "$isa" = default ] && isa_env=() || isa_env=(MUSER_CPU_ISA="$isa")
  env "${isa_env[@]}" LLVM_PROFILE_FILE="$out/fuzz-%p.profraw" ASAN_OPTIONS=detect_leaks=0 \
    "$out/tests/fuzz/muser_fuzz_gguf" -runs=0 -max_len=16384 "${dirs[@]}" > "$out/replay-$isa.log" 2>&1
done
llvm-profdata merge -sparse "$out"/*.profraw -o "$out/fuzz.profdata"
llvm-cov report "$out/tests/fuzz/muser_fuzz_gguf" -instr-profile="$out/fuzz.profdata" \
  src/cpp > "$out/report.txt"
echo "corpus files run: $(find "${dirs[@]}" -type f | wc -l)"
grep -E '^Filename|^TOTAL' "$out/report.txt"
