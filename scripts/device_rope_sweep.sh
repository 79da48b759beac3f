#!/usr/bin/env bash
# Prefill's rope_qk_kv by heads a block (MEMRA_ROPE_HEADS) on qwen3-moe (q/k norms: a block of
# head_dim threads) and llama-8b (no norms), from `profile_decode.py --prefill 512`, then the whole
# GPU suite. Carry [".whl", "build/prebuilt"] after python3 scripts/build_prebuilt.py.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/memra-out}
mkdir -p "$OUT" /tmp/models
MEMRA_TESTS=0 MEMRA_BENCH=0 bash scripts/device_run.sh > "$OUT/devrun.txt" 2>&1 || { tail "$OUT/devrun.txt"; exit 1; }
export PYTHONPATH=/tmp/site
gen() { [ -f /tmp/models/$1.gguf ] || python3 -m memra_engine.model.synthetic /tmp/models/$1.gguf --preset $1 --quiet --threads 8; }
gen qwen3-moe > "$OUT/gen.log" 2>&1
gen llama-8b >> "$OUT/gen.log" 2>&1 &
for m in qwen3-moe llama-8b; do
  [ $m = llama-8b ] && wait
  for h in ${ROPE_HEADS:-1 2 4 8 40}; do
    MEMRA_ROPE_HEADS=$h python3 scripts/profile_decode.py /tmp/models/$m.gguf --prefill 512 > "$OUT/prof-$m-$h.txt" 2>&1
    echo "$m heads $h: $(grep '^prefill' "$OUT/prof-$m-$h.txt" | cut -d, -f2) | $(grep -E '^ +rope_qk_kv' "$OUT/prof-$m-$h.txt" \
      | awk '{print $1, $2, $3, $5}')"
  done
done
[ "${SUITE:-1}" = 1 ] && timeout ${SUITE_S:-330} python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu > "$OUT/suite.txt" 2>&1
tail -3 "$OUT/suite.txt" 2>/dev/null
