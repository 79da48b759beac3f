#!/usr/bin/env bash
# Issue 15's benchmark table: memra and llama.cpp on the same Qwen3-MoE-shape Q4_K_M file (random
# weights, quantized by llama-quantize, as issue 16's dense figures), all experts resident and with
# a share S of the experts in VRAM: memra `--moe-share S`, llama.cpp `--n-cpu-moe N` with
# N = round((1 - S) * 24) layers' experts on the CPU. Two phases, for two device calls in a row
# (a call lasts at most 10 minutes; the detached jobs outlive a call while the machine stays warm):
#
#   bash scripts/device_moe_compare.sh prepare   # llama.cpp build and the F16 model, both detached
#   bash scripts/device_moe_compare.sh bench     # waits for both, quantizes, runs both engines
#
# Needs scripts/device_run.sh's install in /tmp/site (MEMRA_BENCH=0 MEMRA_TESTS=0) and .whl/llamacpp
# carried (cp -r ../shared/device/llamacpp .whl/). MEMRA_MOE_SHARE (default 0.25). Output in $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/memra-out}
SHARE=${MEMRA_MOE_SHARE:-0.25}
F16=/tmp/models/qwen3-moe-f16.gguf
Q4=/tmp/models/qwen3-moe-q4_k_m.gguf
BIN=/tmp/llama.cpp/build/bin
mkdir -p "$OUT" /tmp/models
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }

# wait_for FILE PATTERN SECONDS: poll a log for a line (never pgrep -f: it matches this shell's own
# command line when the pattern is in it)
wait_for() {
  local left=$3
  while ! grep -q "$2" "$1" 2>/dev/null; do
    (( left <= 0 )) && { echo "timed out waiting for '$2' in $1"; return 1; }
    sleep 5; left=$(( left - 5 ))
  done
}

case "${1:-}" in
prepare)
  if [ ! -x "$BIN/llama-bench" ]; then
    cp -r .whl/llamacpp /tmp/ && (setsid nohup bash /tmp/llamacpp/build.sh > /dev/null 2>&1 < /dev/null &)
    stamp "llama.cpp build started (detached)"
  fi
  if [ ! -f "$F16" ]; then
    (setsid nohup bash -c "python3 -m memra_engine.model.synthetic '$F16.part' --preset qwen3-moe --quant F16 \
      --quiet --threads 8 && mv '$F16.part' '$F16' && echo 'f16 model done' || echo 'f16 model failed'" \
      > /tmp/moe-f16.log 2>&1 < /dev/null &)
    stamp "F16 model started (detached, /tmp/moe-f16.log)"
  fi
  ;;
bench)
  [ -f "$F16" ] || wait_for /tmp/moe-f16.log "f16 model" 420 || exit 1
  [ -f "$F16" ] || { cat /tmp/moe-f16.log; exit 1; }
  wait_for /tmp/llama.cpp/build.log "llama.cpp build rc" 420 || exit 1
  grep -q "llama.cpp build rc 0" /tmp/llama.cpp/build.log || { tail -20 /tmp/llama.cpp/build.log; exit 1; }
  if [ ! -f "$Q4" ]; then
    stamp "llama-quantize Q4_K_M"
    "$BIN/llama-quantize" "$F16" "$Q4" Q4_K_M 16 > "$OUT/quantize.log" 2>&1 || { tail -5 "$OUT/quantize.log"; exit 1; }
  fi
  ncmoe=$(python3 -c "print(round((1 - $SHARE) * 24))")
  stamp "memra resident"
  python3 -m memra_engine.bench "$Q4" --backend cuda --runs 3 --json > "$OUT/memra-resident.json" 2>> "$OUT/misc.log"
  stamp "memra --moe-share $SHARE"
  python3 -m memra_engine.bench "$Q4" --backend cuda --runs 3 --json --moe-share "$SHARE" \
    > "$OUT/memra-share.json" 2>> "$OUT/misc.log"
  stamp "llama.cpp resident"
  "$BIN/llama-bench" -m "$Q4" -p 512 -n 128 -r 3 -fa 1 -o json > "$OUT/llama-resident.json" 2>> "$OUT/misc.log"
  stamp "llama.cpp --n-cpu-moe $ncmoe"
  "$BIN/llama-bench" -m "$Q4" -p 512 -n 128 -r 3 -fa 1 -ncmoe "$ncmoe" -o json > "$OUT/llama-share.json" 2>> "$OUT/misc.log"
  stamp "done"
  python3 - "$OUT" "$SHARE" "$ncmoe" <<'PY'
import json, pathlib, sys
out, share, ncmoe = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3]

def load(name):
    p = out / name
    return json.loads(p.read_text()) if p.exists() and p.read_text().strip() else None

def llama(rows, n_prompt, n_gen):
    for r in rows or []:
        if r.get("n_prompt") == n_prompt and r.get("n_gen") == n_gen:
            return r["avg_ts"]
    return float("nan")

print(f"| | pp512 memra | pp512 llama.cpp | tg128 memra (graph / decode_sample default knobs) | tg128 llama.cpp | hit rate | copy GB/s |")
print("|---|---|---|---|---|---|---|")
for label, m, l in (("all experts resident", "memra-resident.json", "llama-resident.json"),
                    (f"{share} of expert bytes (llama.cpp --n-cpu-moe {ncmoe})", "memra-share.json", "llama-share.json")):
    r, rows = load(m) or {}, load(l)
    print(f"| {label} | {r.get('pp512_tok_s', float('nan')):,.0f} | {llama(rows, 512, 0):,.0f} | "
          f"{r.get('tg128_graph_tok_s', float('nan')):,.0f} / {r.get('tg128_decode_sample_default_sampling_tok_s', float('nan')):,.0f} | "
          f"{llama(rows, 0, 128):,.0f} | {r.get('moe_hit_rate', float('nan'))} | {r.get('moe_copy_gb_s', float('nan'))} |")
PY
  ;;
*)
  echo "usage: bash scripts/device_moe_compare.sh prepare|bench" >&2; exit 1 ;;
esac
