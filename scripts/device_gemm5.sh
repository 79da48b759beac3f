#!/usr/bin/env bash
# One device call for the warp-specialized prefill GEMM (gemm5_<type>, cuda/gemm.cu): its GPU tests,
# the GEMM microbenchmark (every tile), and memra-bench pp on the 8B shape with the old default
# (MEMRA_GEMM=gemm3) against MEMRA_GEMM=gemm5, alternating; GEMM5_MICRO=0 skips the tests and the
# microbenchmark, GEMM5_SUITE=1 runs the whole GPU suite last. Carry [".whl", "build/prebuilt"].
# Usage: bash scripts/device_gemm5.sh [shape ...]   (default: llama-8b)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/memra-out}
mkdir -p "$OUT" /tmp/models
MEMRA_TESTS=0 MEMRA_BENCH=0 bash scripts/device_run.sh > "$OUT/setup.log" 2>&1 || { tail -20 "$OUT/setup.log"; exit 1; }
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
shapes=("${@:-llama-8b}")
( for s in "${shapes[@]}"; do
    [ -f "/tmp/models/$s.gguf" ] || python3 -m memra_engine.model.synthetic "/tmp/models/$s.gguf" --preset "$s" --quiet --threads 8
  done > "$OUT/synth.log" 2>&1 ) &
synth=$!
if [ "${GEMM5_MICRO:-1}" != 0 ]; then
  python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_gemm.py > "$OUT/test_gemm.log" 2>&1
  echo "test_gemm: $(tail -1 "$OUT/test_gemm.log")"
  grep -E "FAILED|Error" "$OUT/test_gemm.log" | head -8
  python3 scripts/bench_kernels.py --gemm-only > "$OUT/gemm.txt" 2>&1
  grep "^gemm" "$OUT/gemm.txt"
fi
wait $synth
for s in "${shapes[@]}"; do
  for tile in gemm3 gemm5 gemm3 gemm5; do
    [ -f "/tmp/models/$s.gguf" ] || { echo "no $s"; break; }
    MEMRA_GEMM=$tile python3 -m memra_engine.bench "/tmp/models/$s.gguf" --backend cuda --runs 3 --n-gen 16 --json \
      > "$OUT/pp-$s-$tile.json" 2>> "$OUT/misc.log"
    python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[2], sys.argv[3], 'pp512', round(r['pp512_tok_s'],1))" \
      "$OUT/pp-$s-$tile.json" "$s" "$tile"
  done
done
if [ "${GEMM5_SUITE:-0}" != 0 ]; then  # the whole GPU suite, gemm5 the default
  timeout 300 python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu > "$OUT/pytest.log" 2>&1
  echo "pytest -m gpu: $(tail -1 "$OUT/pytest.log")"
  grep -E "^FAILED|^ERROR" "$OUT/pytest.log" | head -10
fi
