#!/usr/bin/env bash
# MEMRA_L2_AHEAD (weights asked into L2 while each layer's attention runs) on the GPU in one call:
# its GPU tests, then the synthetic Llama-8B and 1B decode steps profiled (`profile_decode.py --ctx
# 128`, µs a token) and memra-bench tg128 / tg @4096 at each budget, 0 (off) first and last.
# ~8 minutes on a fresh machine (the 8B file is most of it). Carry [".whl", "build/prebuilt"] after
# python3 scripts/build_prebuilt.py. BUDGETS="0 8 16 32 0" (MiB a layer) and MODELS override.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/memra-out}
mkdir -p "$OUT" /tmp/models
MEMRA_TESTS=0 MEMRA_BENCH=0 bash scripts/device_run.sh > "$OUT/devrun.txt" 2>&1 || { tail "$OUT/devrun.txt"; exit 1; }
export PYTHONPATH=/tmp/site
MODELS=${MODELS:-llama-8b llama-1b}
for m in $MODELS; do
  [ -f /tmp/models/$m.gguf ] || python3 -m memra_engine.model.synthetic /tmp/models/$m.gguf --preset $m --quiet --threads 8 \
    > "$OUT/gen-$m.log" 2>&1 &
done
python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_l2_ahead_gpu.py tests/gpu/test_backend.py \
  > "$OUT/tests.txt" 2>&1
grep -E "passed|failed|Error" "$OUT/tests.txt" | tail -3
wait
for m in $MODELS; do
  for mib in ${BUDGETS:-0 8 16 32 0}; do
    MEMRA_L2_AHEAD=$mib timeout 120 python3 scripts/profile_decode.py /tmp/models/$m.gguf --ctx 128 \
      > "$OUT/prof-$m-$mib.txt" 2>&1
    MEMRA_L2_AHEAD=$mib timeout 150 python3 -m memra_engine.bench /tmp/models/$m.gguf --backend cuda --runs 3 \
      --ctx-depth 4096 --n-prompt 16 --json > "$OUT/bench-$m-$mib.json" 2>> "$OUT/bench.err"
    python3 - "$OUT/bench-$m-$mib.json" "$m" "$mib" "$(grep -m1 -o 'graph [0-9.]* µs' "$OUT/prof-$m-$mib.txt")" <<'PY'
import json, sys
b = json.load(open(sys.argv[1]))
print(f"{sys.argv[2]} L2_AHEAD={sys.argv[3]} MiB: profile {sys.argv[4]} | tg128 graph {b['tg128_graph_tok_s']:.1f}"
      f" engine {b['tg128_decode_sample_default_sampling_tok_s']:.1f} | @4096 graph {b['tg128_graph_at_4096_tok_s']:.1f}")
PY
  done
done
