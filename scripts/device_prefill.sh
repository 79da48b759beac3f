#!/usr/bin/env bash
# The prefill GEMM round on the device (issue 16): install and build (scripts/device_run.sh), the GEMM
# tests, the GEMM microbenchmark (every tile, scripts/bench_kernels.py --gemm-only), then memra-bench
# for each shape:tile of MEMRA_PREFILL_RUNS (default "llama-8b:gemm3 llama-8b:auto": synthetic shapes,
# a forced tile against the default choice; MEMRA_GEMM=tile), MEMRA_PREFILL_QUICK=1 one GEMM shape, and with MEMRA_PREFILL_PROFILE=1
# scripts/profile_decode.py --prefill 512 on each shape.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/memra-out}
mkdir -p "$OUT" /tmp/models
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
MEMRA_TESTS=0 MEMRA_BENCH=0 bash scripts/device_run.sh > "$OUT/setup.log" 2>&1 || { tail -20 "$OUT/setup.log"; exit 1; }
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
RUNS=${MEMRA_PREFILL_RUNS:-llama-8b:gemm3 llama-8b:auto}
SHAPES=$(for r in $RUNS; do echo "${r%%:*}"; done | sort -u)
pids=()
for shape in $SHAPES; do
  [ -f "/tmp/models/$shape.gguf" ] || { python3 -m memra_engine.model.synthetic "/tmp/models/$shape.gguf" --preset "$shape" \
    --quiet --threads 8 >> "$OUT/misc.log" 2>&1 & pids+=($!); }
done
if [ "${MEMRA_TESTS:-1}" != 0 ]; then
  stamp "pytest -m gpu ${MEMRA_PREFILL_TESTS:-tests/gpu/test_gemm.py}"
  python3 -m pytest -m gpu -q -p no:cacheprovider -rfE ${MEMRA_PREFILL_TESTS:-tests/gpu/test_gemm.py} > "$OUT/pytest-prefill.log" 2>&1
  tail -2 "$OUT/pytest-prefill.log"; grep -E "^FAILED|^ERROR" "$OUT/pytest-prefill.log" | head -12
fi
if [ "${MEMRA_PREFILL_KERNELS:-1}" != 0 ]; then
  stamp "bench_kernels --gemm-only"
  python3 scripts/bench_kernels.py --gemm-only ${MEMRA_PREFILL_QUICK:+--quick} > "$OUT/gemm.txt" 2>&1
  grep "^gemm" "$OUT/gemm.txt" | sed 's/ T=512//'
fi
for p in "${pids[@]}"; do wait "$p"; done
if [ "${MEMRA_PREFILL_PROFILE:-0}" != 0 ]; then
  for shape in $SHAPES; do
    stamp "profile_decode --prefill 512 $shape"
    python3 scripts/profile_decode.py "/tmp/models/$shape.gguf" --prefill 512 > "$OUT/profile-prefill-$shape.txt" 2>&1
    grep -A16 "^prefill" "$OUT/profile-prefill-$shape.txt" || tail -5 "$OUT/profile-prefill-$shape.txt"
  done
fi
for run in $RUNS; do
  shape=${run%%:*} tile=${run#*:}
  stamp "memra-bench $shape tile $tile"
  [ "$tile" = auto ] && g= || g=$tile
  MEMRA_GEMM=$g python3 -m memra_engine.bench "/tmp/models/$shape.gguf" --backend cuda --runs 3 --json \
    > "$OUT/bench-$shape-$tile.json" 2>> "$OUT/misc.log"
  python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[2], sys.argv[3], {k: round(v, 1) for k, v in r.items() if k.endswith('tok_s')})" \
    "$OUT/bench-$shape-$tile.json" "$shape" "$tile" || tail -3 "$OUT/misc.log"
done
stamp done
