#!/usr/bin/env bash
# The q8_k256 Q4_K matvecs (cuda/k256.cu) against the q8_1 ones on the synthetic Llama-8B shape, one
# device call (after device_run.sh installed memra into /tmp/site): the decode graph per kernel
# (profile_decode.py, with the 9-row verify graph) and memra-bench, MEMRA_K256=1 then 0.
# Usage: bash scripts/device_k256.sh [shape ...] (default llama-8b); OUT as device_run.sh's;
# MEMRA_K256_BENCH=0 skips memra-bench (the profile alone).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/memra-out}
export PYTHONPATH=/tmp/site:scripts PYTHONUNBUFFERED=1
mkdir -p /tmp/models "$OUT"
for shape in "${@:-llama-8b}"; do
  [ -f "/tmp/models/$shape.gguf" ] || python3 -m memra_engine.model.synthetic "/tmp/models/$shape.gguf" \
      --preset "$shape" --quiet || exit 1
  for k in 1 0; do
    export MEMRA_K256=$k
    python3 scripts/profile_decode.py "/tmp/models/$shape.gguf" --ctx 128 --verify 9 > "$OUT/profile-$shape-k$k.txt" 2>&1
    [ "${MEMRA_K256_BENCH:-1}" = 0 ] || python3 -m memra_engine.bench "/tmp/models/$shape.gguf" --backend cuda --runs 3 \
        --json > "$OUT/bench-$shape-k$k.json" 2>> "$OUT/misc.log"
    echo "== $shape MEMRA_K256=$k"
    grep -E "graph|matvec|quantize|norm|silu" "$OUT/profile-$shape-k$k.txt"
    [ -f "$OUT/bench-$shape-k$k.json" ] && python3 -c "import json,sys; r=json.load(open(sys.argv[1])); \
print({k: round(v, 1) for k, v in r.items() if k.endswith('tok_s')})" "$OUT/bench-$shape-k$k.json"
  done
done
