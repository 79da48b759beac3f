#!/usr/bin/env bash
# Speculative verify cost on the GPU machine, in one call: install and build (device_run.sh), the
# GPU tests of the verify path (batched matvec columns and slices, the fused q|k|v for verify rows,
# the sampler's rows in one launch, greedy speculative = plain), then per shape the verify graph's
# per-kernel profile and bench_spec.py verify for each MEMRA_VERIFY_SLICE value; a table last.
# Usage: bash scripts/device_verify.sh     MEMRA_VERIFY_SHAPES="smollm2-135m llama-8b" (default),
#        MEMRA_VERIFY_SLICES="smollm2-135m:,1,2,4 llama-8b:,8" (an empty value: the default; 16:
#        no slicing anywhere; 8 on Q4_K: the 8-column MMA kernel in two slices for 9 rows), MEMRA_VERIFY_TESTS=0.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/memra-out}
mkdir -p "$OUT" /tmp/models
MEMRA_TESTS=0 MEMRA_BENCH=0 bash scripts/device_run.sh > "$OUT/setup.log" 2>&1 || { tail -20 "$OUT/setup.log"; exit 1; }
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
shapes=${MEMRA_VERIFY_SHAPES:-smollm2-135m llama-8b}
(for s in $shapes; do [ -f "/tmp/models/$s.gguf" ] || python3 -m memra_engine.model.synthetic "/tmp/models/$s.gguf" --preset "$s" --quiet; done) \
  > "$OUT/synth.log" 2>&1 &
if [ "${MEMRA_VERIFY_TESTS:-1}" != 0 ]; then
  python3 -m pytest -m gpu -q -p no:cacheprovider -rfE tests/gpu/test_matvec.py tests/gpu/test_sampling_gpu.py \
    tests/gpu/test_speculative_gpu.py tests/gpu/test_backend.py \
    -k "batched or tensor_core or qkv_rope or rows or speculative or verify or draft or graph" > "$OUT/verify-tests.log" 2>&1
  echo "tests: $(tail -1 "$OUT/verify-tests.log")"
fi
wait
slices=${MEMRA_VERIFY_SLICES:-"smollm2-135m:,1,2,4 llama-8b:,8"}
for s in $shapes; do
  python3 scripts/profile_decode.py "/tmp/models/$s.gguf" --ctx 128 --verify 9 > "$OUT/verify-profile-$s.txt" 2>&1
  for spec in $slices; do
    [ "${spec%%:*}" = "$s" ] || continue
    IFS=, read -ra vs <<< "${spec#*:}"
    [ ${#vs[@]} -eq 0 ] && vs=("")
    for v in "${vs[@]}"; do
      echo "== $s MEMRA_VERIFY_SLICE=${v:-default}"
      MEMRA_VERIFY_SLICE=$v python3 scripts/bench_spec.py verify "/tmp/models/$s.gguf" 2>&1 | tail -9
    done >> "$OUT/verify-cost.txt"
  done
done
grep -E "FAILED|ERROR" "$OUT/verify-tests.log" 2>/dev/null | head -20
for s in $shapes; do echo "== profile $s"; cut -c1-96 "$OUT/verify-profile-$s.txt"; done
cat "$OUT/verify-cost.txt"
