#!/usr/bin/env bash
# Verify a tree on a CUDA machine in one go: build, the whole pytest suite
# (GPU tests run there), the CUDA tests alone, then the CUDA benches of record
# (a Gemma-3-shaped Q8_0 head, then the seed's Q5_K head).
# Wheels in .whl/ (e.g. gguf, for a machine without a package index) are
# installed first when present; logs go to $OUT (default: a temp folder).
set -uo pipefail
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."
OUT=${OUT:-$(mktemp -d)}
if ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site || exit 1
fi
s=$(date +%s)
python3 -m pip install --no-build-isolation -q . -Ccmake.define.MUSER_CUDA_ARCHS=90 > "$OUT/build.log" 2>&1 \
  || { tail -50 "$OUT/build.log"; exit 1; }
echo "build $(( $(date +%s) - s )) s"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
timeout 200 python3 -m pytest -q -p no:cacheprovider tests -x > "$OUT/tests.log" 2>&1
tail -1 "$OUT/tests.log"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py -rs 2>&1 | tail -2
timeout 100 python3 bench/cuda_head.py --hidden 640 --vocab 262144 --weight-type Q8_0 --no-torch \
  --json "$OUT/bench_q80.json" | tail -16  # a Gemma-3-shaped head (tied Q8_0 embedding)
timeout 150 python3 bench/cuda_head.py --json "$OUT/bench.json" | tail -22
echo "all done at $(( $(date +%s) - s )) s; logs in $OUT"
