#!/usr/bin/env bash
# Issue 16's unmeasured quants: the Llama-8B shape as Q5_K, Q6_K and Q4_0 (one ggml type each, the
# synthetic generator's --quant), memra against llama.cpp on the same files, plus the decode matvec
# sweep of those types (and Q8_0) at the 8B shapes, to pick quant_ops.matvec_variant's defaults.
# Carry ".whl" (with ../shared/device/llamacpp copied in, as device_side_by_side.sh) and run
#   bash scripts/device_quants.sh            # build llama.cpp detached, files, sweep, memra-bench, llama-bench
#   MEMRA_QUANTS_LLAMA=1 bash scripts/device_quants.sh   # next call, machine warm: llama-bench only
# The first call fits in 10 minutes when llama.cpp's build (6-7 min) is done by then; if not,
# the second call runs the llama.cpp half on the files the first one wrote.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/memra-out}
mkdir -p "$OUT" /tmp/models
t0=$(date +%s); st() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
QUANTS=${MEMRA_QUANTS:-Q5_K Q6_K Q4_0}
llama() {
  while ! grep -q "llama.cpp build rc" /tmp/llama.cpp/build.log 2>/dev/null && [ $(( $(date +%s) - t0 )) -lt 520 ]; do sleep 5; done
  grep "llama.cpp build rc" /tmp/llama.cpp/build.log || { echo "llama.cpp not built yet: run again with MEMRA_QUANTS_LLAMA=1"; return; }
  for q in $QUANTS; do
    st "llama-bench $q"
    timeout $(( 585 - $(date +%s) + t0 )) bash /tmp/llamacpp/bench.sh /tmp/models/l8-$q.gguf > "$OUT/llama-$q.json" 2>> "$OUT/llama.err"
    python3 - "$OUT/llama-$q.json" "$q" <<'PY'
import json, sys
text, dec, i = open(sys.argv[1]).read(), json.JSONDecoder(), 0
while (j := text.find("[", i)) >= 0:
    try:
        rows, i = dec.raw_decode(text, j)
    except ValueError:
        break
    for r in rows:
        print(f"llama.cpp l8-{sys.argv[2]} pp {r['n_prompt']} tg {r['n_gen']} depth {r.get('n_depth', 0)}: {r['avg_ts']:,.1f} tok/s")
PY
  done
}
if [ "${MEMRA_QUANTS_LLAMA:-0}" = 1 ]; then llama; exit 0; fi
[ -f /tmp/llama.cpp/build.log ] || { cp -r .whl/llamacpp /tmp/ && (setsid nohup nice -n 19 bash /tmp/llamacpp/build.sh > /dev/null 2>&1 < /dev/null &); }
MEMRA_TESTS=0 MEMRA_BENCH=0 bash scripts/device_run.sh > "$OUT/setup.log" 2>&1 || { tail -20 "$OUT/setup.log"; exit 1; }
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
st installed
pids=()
for q in $QUANTS; do
  [ -f /tmp/models/l8-$q.gguf ] || { python3 -m memra_engine.model.synthetic /tmp/models/l8-$q.gguf --preset llama-8b \
    --quant $q --quiet --threads 3 > "$OUT/gen-$q.log" 2>&1 & pids+=($!); }
done
M=""
for q in $QUANTS Q8_0; do for s in 28672x4096 4096x14336 4096x4096 6144x4096 1024x4096; do M="$M $s:$q"; done; done
python3 scripts/bench_decode_matvecs.py $M > "$OUT/matvecs.txt" 2>&1; st "matvec sweep"
grep "^  " "$OUT/matvecs.txt" | cut -c1-160
for p in "${pids[@]}"; do wait "$p"; done; st "files written"
for q in $QUANTS; do
  timeout 120 python3 -m memra_engine.bench /tmp/models/l8-$q.gguf --backend cuda --ctx-depth 4096 --runs 5 --json \
    > "$OUT/bench-$q.json" 2>> "$OUT/bench.err"
  python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print('memra l8-'+sys.argv[2], {k: round(v, 1) for k, v in r.items() if k.endswith('tok_s') or k.startswith('vram_used')})" \
    "$OUT/bench-$q.json" "$q" || tail -3 "$OUT/bench.err"
done
llama
st done
