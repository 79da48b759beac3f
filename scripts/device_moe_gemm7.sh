#!/usr/bin/env bash
# moe_gemm7 (the routed warp-specialized prefill tile) on the GPU in one call: its kernel tests and
# the MoE GPU tests, then qwen3-moe's 512-token prefill profiled and memra-bench pp512 with
# MEMRA_MOE_GEMM=gemm4 and the default (gemm7 where it fits), alternating 4, 7, 4, 7. ~5 minutes.
# Carry [".whl", "build/prebuilt"] after python3 scripts/build_prebuilt.py.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/memra-out}
mkdir -p "$OUT" /tmp/models
MEMRA_TESTS=0 MEMRA_BENCH=0 bash scripts/device_run.sh > "$OUT/devrun.txt" 2>&1 || { tail "$OUT/devrun.txt"; exit 1; }
export PYTHONPATH=/tmp/site
m=/tmp/models/qwen3-moe.gguf
[ -f $m ] || python3 -m memra_engine.model.synthetic $m --preset qwen3-moe --quiet --threads 8 > "$OUT/gen.log" 2>&1 &
python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_moe_kernels.py tests/gpu/test_moe_gpu.py \
  > "$OUT/moe-tests.txt" 2>&1
grep -E "passed|failed|Error" "$OUT/moe-tests.txt" | tail -5
wait
i=0
for tile in gemm4 gemm7 gemm4 gemm7; do
  i=$((i + 1))
  MEMRA_MOE_GEMM=$tile python3 scripts/profile_decode.py $m --prefill 512 > "$OUT/prof-$i-$tile.txt" 2>&1
  MEMRA_MOE_GEMM=$tile python3 -m memra_engine.bench $m --backend cuda --runs 3 --n-gen 8 --json \
    > "$OUT/bench-$i-$tile.json" 2>> "$OUT/bench.err"
  pp=$(python3 -c "import json, sys; print(round(json.load(open(sys.argv[1]))['pp512_tok_s']))" "$OUT/bench-$i-$tile.json")
  echo "$tile: $(grep '^prefill' "$OUT/prof-$i-$tile.txt" | cut -d, -f2) | $(grep -E '^ +moe_gemm' "$OUT/prof-$i-$tile.txt" \
    | awk '{print $1, $2, $3}' | paste -sd';') | memra-bench pp512 $pp"
done
