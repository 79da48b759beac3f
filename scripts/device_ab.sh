#!/usr/bin/env bash
# A same-call decode A/B against an older tree (ab/old.tar and its fatbins in ab/prebuilt: see
# scripts/ab_old_tree.sh), on synthetic models made here if missing. Run after device_run.sh (or
# device_decode.sh) installed this tree into /tmp/site; carry [".whl", "build/prebuilt", "ab"].
# First this tree's GPU tests named in MEMRA_AB_TESTS, then MEMRA_AB_ATTN=1 runs
# scripts/bench_attention.py for both trees, then memra-bench (MEMRA_AB_FLAGS, default
# `--ctx-depth 4096 --runs 3`) on each shape, old and new alternating twice.
# Usage: bash scripts/device_ab.sh SHAPE...   (e.g. llama-8b qwen3-moe)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/memra-out}
mkdir -p "$OUT" /tmp/models
export PYTHONPATH=/tmp/site
gens=()
for m in "$@"; do
  [ -f "/tmp/models/$m.gguf" ] && continue
  python3 -m memra_engine.model.synthetic "/tmp/models/$m.gguf" --preset "$m" --quiet --threads 8 \
    > "$OUT/gen-$m.log" 2>&1 &
  gens+=($!)
done
source scripts/ab_old_tree.sh
if [ -n "${MEMRA_AB_TESTS:-}" ]; then
  python3 -m pytest -m gpu -q -p no:cacheprovider $MEMRA_AB_TESTS > "$OUT/tests.txt" 2>&1
  grep -E "passed|failed|Error" "$OUT/tests.txt" | tail -5
fi
if [ "${MEMRA_AB_ATTN:-0}" = 1 ]; then
  PYTHONPATH=/tmp/site-old:/tmp/site python3 scripts/bench_attention.py > "$OUT/attn-old.txt" 2>&1
  python3 scripts/bench_attention.py > "$OUT/attn-new.txt" 2>&1
  grep -E "^(llama-8b|qwen3|shape)" "$OUT/attn-old.txt" | sed 's/^/old /'
  grep -E "^(llama-8b|qwen3|shape)" "$OUT/attn-new.txt" | sed 's/^/new /'
fi
for pid in "${gens[@]}"; do wait "$pid"; done
for m in "$@"; do
  for tree in old new old new; do
    site=/tmp/site; [ $tree = old ] && site=/tmp/site-old:/tmp/site
    i=$((${i:-0} + 1))
    PYTHONPATH=$site timeout 200 python3 -m memra_engine.bench "/tmp/models/$m.gguf" --backend cuda \
      ${MEMRA_AB_FLAGS:---ctx-depth 4096 --runs 3} --json > "$OUT/bench-$i-$tree-$m.json" 2>> "$OUT/bench.err"
    python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[2], sys.argv[3], {k: round(v, 1) for k, v in r.items() if k.endswith('tok_s')})" \
      "$OUT/bench-$i-$tree-$m.json" "$tree" "$m" || tail -3 "$OUT/bench.err"
  done
done
