#!/usr/bin/env bash
# A same-call A/B of a prefill change on one synthetic model: this tree's GPU tests named in
# MEMRA_AB_TESTS, then `profile_decode.py --prefill 512` (the per-kernel table) and memra-bench pp512,
# alternating the old tree (ab/old.tar and its fatbins in ab/prebuilt, made as scripts/ab_old_tree.sh
# says) and this one: old, new, old, new. Carry [".whl", "build/prebuilt", "ab"] after
# python3 scripts/build_prebuilt.py. Usage: bash scripts/device_prefill_ab.sh [PRESET]   (default qwen3-moe)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/memra-out}
preset=${1:-qwen3-moe}
m=/tmp/models/$preset.gguf
mkdir -p "$OUT" /tmp/models
MEMRA_TESTS=0 MEMRA_BENCH=0 bash scripts/device_run.sh > "$OUT/devrun.txt" 2>&1 || { tail "$OUT/devrun.txt"; exit 1; }
export PYTHONPATH=/tmp/site
[ -f $m ] || python3 -m memra_engine.model.synthetic $m --preset $preset --quiet --threads 8 > "$OUT/gen.log" 2>&1 &
gen=$!
source scripts/ab_old_tree.sh
if [ -n "${MEMRA_AB_TESTS:-}" ]; then
  python3 -m pytest -m gpu -q -p no:cacheprovider $MEMRA_AB_TESTS > "$OUT/tests.txt" 2>&1
  grep -E "passed|failed|Error" "$OUT/tests.txt" | tail -5
fi
wait $gen
for tree in old new old new; do
  site=/tmp/site; [ $tree = old ] && site=/tmp/site-old:/tmp/site
  i=$((${i:-0} + 1))
  PYTHONPATH=$site python3 scripts/profile_decode.py $m --prefill 512 > "$OUT/prof-$i-$tree.txt" 2>&1
  PYTHONPATH=$site python3 -m memra_engine.bench $m --backend cuda --runs 3 --n-gen 8 --json \
    > "$OUT/bench-$i-$tree.json" 2>> "$OUT/bench.err"
  pp=$(python3 -c "import json, sys; print(round(json.load(open(sys.argv[1]))['pp512_tok_s']))" "$OUT/bench-$i-$tree.json")
  echo "$tree: $(grep '^prefill' "$OUT/prof-$i-$tree.txt" | cut -d, -f2) | ${MEMRA_AB_KERNELS:+$(grep -E "^ +(${MEMRA_AB_KERNELS})" \
    "$OUT/prof-$i-$tree.txt" | awk '{print $1, $2, $3}' | paste -sd';') |} memra-bench pp512 $pp"
done
