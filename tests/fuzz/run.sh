#!/usr/bin/env bash
# Fuzz the GGUF -> Head path (tests/fuzz/fuzz_gguf.cpp) with libFuzzer,
# ASan and UBSan.
#
#   tests/fuzz/run.sh [JOBS] [SECONDS] [CORPUS_DIR]
#
# JOBS parallel fuzzing processes (default 1), SECONDS of fuzzing per process
# (default 60), CORPUS_DIR the growing corpus (default build/fuzz-work/corpus;
# reuse it to continue a run). Seeds come from build/fuzz-corpus, written by
# tests/test_fuzz_corpus.py (regenerated here when absent; needs the installed
# muser). Findings land in build/fuzz-work/artifacts/ (crash-*, leak-*,
# timeout-*, oom-*; MUSER_FUZZ_WORK names another folder than build/fuzz-work);
# the script exits 1 when there is any, and prints the executions summed
# over all processes.
set -euo pipefail
cd "$(dirname "$0")/../.."
jobs=${1:-1}
seconds=${2:-60}
root=$PWD
work=${MUSER_FUZZ_WORK:-$root/build/fuzz-work}
corpus=${3:-$work/corpus}
mkdir -p "$corpus"
corpus=$(cd "$corpus" && pwd)
seeds=$root/build/fuzz-corpus
bin=$root/build/fuzz/tests/fuzz/muser_fuzz_gguf

echo "== fuzz: building $bin (clang, ASan+UBSan, libFuzzer)"
cmake -S . -B build/fuzz -DMUSER_FUZZ=ON -DMUSER_BUILD_PYTHON=OFF -DMUSER_BUILD_CUDA=OFF \
      -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_COMPILER="${CXX_FUZZ:-clang++}" > /dev/null
cmake --build build/fuzz -j "$(nproc 2>/dev/null || echo 2)" --target muser_fuzz_gguf > /dev/null

if [ ! -d "$seeds" ] || [ -z "$(ls -A "$seeds")" ]; then
  echo "== fuzz: writing the seed corpus to $seeds (tests/test_fuzz_corpus.py)"
  MUSER_FUZZ_CORPUS_DIR="$seeds" python3 -m pytest -q -p no:cacheprovider tests/test_fuzz_corpus.py
fi
mkdir -p "$work/artifacts" "$work/logs"
rm -f "$work"/logs/*.log

# -max_len: the seeds' heads are < 7 KB; longer inputs only run slower.
# -timeout: any single input over 10 s is a finding (a hang).
# -rss_limit_mb / -malloc_limit_mb: an allocation driven by a hostile size is a finding.
flags=(-max_len=16384 -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024 -print_final_stats=1
       -max_total_time="$seconds" -artifact_prefix="$work/artifacts/")
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:${UBSAN_OPTIONS:-}"
echo "== fuzz: $jobs process(es) x ${seconds}s, corpus $corpus (+ seeds $seeds)"
status=0
cd "$work/logs"  # with -jobs, libFuzzer writes fuzz-<i>.log into the current directory
if [ "$jobs" -le 1 ]; then
  "$bin" "${flags[@]}" "$corpus" "$seeds" > fuzz-0.log 2>&1 || status=$?
else
  "$bin" "${flags[@]}" -jobs="$jobs" -workers="$jobs" "$corpus" "$seeds" > fuzz-main.log 2>&1 || status=$?
fi
cd "$root"

execs=0
for log in "$work"/logs/fuzz-*.log; do
  n=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  execs=$((execs + ${n:-0}))
  sed -n 's/^stat::average_exec_per_sec: *\(.*\)/'"$(basename "$log")"': \1 exec\/s/p' "$log" | tail -1
done
findings=$(find "$work/artifacts" -type f | wc -l)
echo "== fuzz: $execs executions, corpus $(ls "$corpus" | wc -l) files, $findings finding(s), exit status $status"
if [ "$findings" -gt 0 ] || [ "$status" -ne 0 ]; then
  ls -l "$work/artifacts"
  tail -n 60 "$work"/logs/fuzz-*.log
  exit 1
fi
