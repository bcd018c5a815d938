#!/usr/bin/env bash
# CI, after the README's test command: the reliability builds of
# docs/reliability.md. Each step prints what it does; any failure, sanitizer
# report or fuzzer finding fails CI. Needs clang and libclang-rt-dev (.ci/run
# installs them) and the normally installed muser (for the seed corpus).
# Everything is built with the CUDA backend off, into build/ci-*.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc 2>/dev/null || echo 2)
step() { echo "== ci: $* ($(date -u +%T))"; }
# Configure + build a C++ test tree quietly; show the log only on failure.
build_tests() {
  local dir=$1; shift
  cmake -S . -B "$dir" -DMUSER_BUILD_TESTS=ON -DMUSER_BUILD_PYTHON=OFF -DMUSER_BUILD_CUDA=OFF "$@" \
        > "$dir.log" 2>&1 && cmake --build "$dir" -j "$jobs" >> "$dir.log" 2>&1 || { cat "$dir.log"; exit 1; }
}
mkdir -p build

step "clang: the C++ tests built with clang++ (Release), then ctest"
build_tests build/ci-clang -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=clang++
ctest --test-dir build/ci-clang --output-on-failure -j "$jobs"

# Sanitizer runtime options. abort_on_error/halt_on_error: the first report
# fails the run. detect_leaks=1: LeakSanitizer at exit. intercept_tls_get_addr=0:
# GCC 12's libasan misreads a dynamic TLS block that starts 16 bytes past a page
# and its exit-time leak scan then faults ("Tracer caught signal 11"); the
# blocks stay in the scan as the dynamic linker's allocations. The step below
# arms that trap on purpose (tests/lsan_dtls/guess_trap.c).
asan_opts="detect_leaks=1:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1:intercept_tls_get_addr=0"
ubsan_opts="print_stacktrace=1:halt_on_error=1"

step "ASan: LeakSanitizer with these options survives a dynamic TLS block 16 bytes past a page (tests/lsan_dtls)"
mkdir -p build/ci-lsan-dtls
gcc -O1 -g -fPIC -shared -o build/ci-lsan-dtls/libtls_module.so tests/lsan_dtls/tls_module.c
gcc -O1 -g -fsanitize=address -o build/ci-lsan-dtls/guess_trap tests/lsan_dtls/guess_trap.c -ldl
# no static TLS to spare (the module's block is malloc'd) and no quarantine
# (a freed chunk is the next one handed out): the program arms the trap itself
trap_env=(env GLIBC_TUNABLES=glibc.rtld.optional_static_tls=0)
trap_opts="quarantine_size_mb=0:thread_local_quarantine_size_kb=0"
"${trap_env[@]}" ASAN_OPTIONS="$asan_opts:$trap_opts" build/ci-lsan-dtls/guess_trap build/ci-lsan-dtls/libtls_module.so
# the control: with libasan's default the same program must die in the scan,
# or the trap above proved nothing about this runtime
if "${trap_env[@]}" ASAN_OPTIONS="${asan_opts%:intercept_tls_get_addr=0}:$trap_opts" \
     build/ci-lsan-dtls/guess_trap build/ci-lsan-dtls/libtls_module.so > build/ci-lsan-dtls/control.log 2>&1; then
  echo "the control survived: this libasan no longer misreads the block (intercept_tls_get_addr=0 may go)"
else
  grep -q "LeakSanitizer has encountered a fatal error" build/ci-lsan-dtls/control.log || { cat build/ci-lsan-dtls/control.log; exit 1; }
  echo "the control (libasan's default) died in the leak scan, as expected"
fi

step "ASan+UBSan: the C++ tests (GCC, -O1 -g, MUSER_SANITIZE=address,undefined), ctest with LeakSanitizer on"
build_tests build/ci-asan -DCMAKE_BUILD_TYPE=Debug -DMUSER_SANITIZE=address,undefined
ASAN_OPTIONS=$asan_opts UBSAN_OPTIONS=$ubsan_opts ctest --test-dir build/ci-asan --output-on-failure -j "$jobs"

step "TSan: the C++ tests (GCC, MUSER_SANITIZE=thread, OpenMP off: TSan misreports GCC's OpenMP runtime), ctest"
build_tests build/ci-tsan -DCMAKE_BUILD_TYPE=Debug -DMUSER_SANITIZE=thread -DCMAKE_DISABLE_FIND_PACKAGE_OpenMP=ON
TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1" ctest --test-dir build/ci-tsan --output-on-failure -j "$jobs"

step "ASan+UBSan: the extension built with the sanitizers into build/venv-asan (the normal install is untouched)"
# --without-pip: the venv uses the system pip (no ensurepip / python3-venv needed)
python3 -m venv --system-site-packages --without-pip build/venv-asan
build/venv-asan/bin/python -m pip install -q --no-build-isolation -C build-dir=build/ci-py-asan \
  -C cmake.build-type=Debug -C cmake.define.MUSER_BUILD_CUDA=OFF \
  -C cmake.define.MUSER_SANITIZE=address,undefined . > build/ci-py-asan.log 2>&1 || { cat build/ci-py-asan.log; exit 1; }
# the tests below must import this build (found, not imported: it needs the ASan preload)
build/venv-asan/bin/python -c "import importlib.util as u, sys; o = u.find_spec('muser').origin; print(o); sys.exit('venv-asan' not in o)"

step "ASan+UBSan: the Python tests with the sanitizer runtime preloaded, LeakSanitizer on (tests/lsan-python.supp)"
# The extension is loaded into an uninstrumented python, so the ASan runtime
# must come first (LD_PRELOAD), and libstdc++ with it: ASan's __cxa_throw
# interceptor finds the real one only if libstdc++ is loaded when ASan starts.
# CPython, numpy and libggml keep allocations past exit; the suppressions
# drop leaks allocated in those modules, judged on the allocating frames
# only (malloc_context_size=4), so a leak allocated in muser's extension or
# in libstdc++ is still reported. The cost: allocation stacks in ASan reports
# are 4 frames deep here (rerun one test with a larger value to see more).
# --capture=sys: a report written to fd 2 by a dying process reaches the log.
LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libstdc++.so)" \
ASAN_OPTIONS="$asan_opts:malloc_context_size=4:detect_stack_use_after_return=0" \
LSAN_OPTIONS="suppressions=$PWD/tests/lsan-python.supp:print_suppressions=0" UBSAN_OPTIONS=$ubsan_opts \
  build/venv-asan/bin/python -m pytest -q --capture=sys -p no:cacheprovider tests

step "fuzz: the seed corpus written by tests/test_fuzz_corpus.py into build/fuzz-corpus"
rm -rf build/fuzz-corpus
MUSER_FUZZ_CORPUS_DIR=build/fuzz-corpus python3 -m pytest -q -p no:cacheprovider tests/test_fuzz_corpus.py

step "fuzz: 60 s of libFuzzer with ASan+UBSan over GGUF bytes -> Head (tests/fuzz/run.sh)"
rm -rf build/fuzz-work
bash tests/fuzz/run.sh 1 60
step "reliability checks done"
