#!/usr/bin/env bash
# Issue 16's side-by-side figures in one device call: llama.cpp built (detached, niced) while memra
# installs and the synthetic Llama-8B and Llama-3.2-1B shapes are written, then memra-bench and
# llama-bench on the same files, one after the other, each one's peak VRAM sampled the same way, and a
# short table last.
# Needs .whl (../shared/device/prepare.sh) with ../shared/device/llamacpp copied into it:
#   cp -r ../shared/device/llamacpp .whl/   then carry ".whl" and run: bash scripts/device_side_by_side.sh
# About 7 minutes on a fresh H200 (llama.cpp's build is most of it). MODELS="llama-8b qwen3-moe": other
# synthetic presets (default llama-8b llama-1b); PP4096=1 adds pp at 4,096 prompt tokens for both engines;
# PREFILL_PROFILE="qwen3-moe" profiles a 512-token prefill of those (in MODELS) while llama.cpp builds.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/memra-out}
mkdir -p "$OUT" /tmp/models
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
if [ ! -f /tmp/llama.cpp/build.log ]; then  # not built or building already (device_decode.sh MEMRA_DECODE_LLAMA=1)
  cp -r .whl/llamacpp /tmp/ && (setsid nohup nice -n 19 bash /tmp/llamacpp/build.sh > /dev/null 2>&1 < /dev/null &)
fi
MEMRA_TESTS=0 MEMRA_BENCH=0 bash scripts/device_run.sh > "$OUT/devrun.txt" 2>&1; echo "memra installed $(el)s"
export PYTHONPATH=/tmp/site
MODELS=${MODELS:-llama-8b llama-1b}
for m in $MODELS; do
  [ -f /tmp/models/$m.gguf ] || python3 -m memra_engine.model.synthetic /tmp/models/$m.gguf --preset $m --quiet --threads 4 \
    >> "$OUT/gen.log" 2>&1 &
done
wait; echo "models written $(el)s"
# VRAM the same way for both engines: the device's memory.used, sampled every 0.1 s while the
# command runs, peak minus the idle figure before it (CUDA context, weights, KV, buffers: all of it)
peak_mib() {  # peak_mib NAME CMD...: runs CMD, appends "NAME PEAK" to $OUT/vram-peak.txt
  local name=$1; shift
  local base; base=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1)
  (while :; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1; sleep 0.1; done) \
    > "$OUT/vram-$name.txt" 2> /dev/null &
  local sampler=$!
  "$@"; local rc=$?
  kill $sampler 2> /dev/null; wait $sampler 2> /dev/null
  echo "$name $(( $(sort -n "$OUT/vram-$name.txt" | tail -1) - base ))" >> "$OUT/vram-peak.txt"
  return $rc
}
for m in $MODELS; do
  peak_mib "memra-$m" timeout 150 python3 -m memra_engine.bench /tmp/models/$m.gguf --backend cuda --ctx-depth 4096 \
    --runs 5 --json > "$OUT/bench-$m.json" 2>> "$OUT/bench.err"; echo "memra-bench $m $(el)s"
  [ "${PP4096:-0}" = 0 ] || timeout 100 python3 -m memra_engine.bench /tmp/models/$m.gguf --backend cuda --n-prompt 4096 \
    --n-gen 8 --runs 3 --json > "$OUT/bench4k-$m.json" 2>> "$OUT/bench.err"
done
for m in ${PREFILL_PROFILE:-}; do  # PREFILL_PROFILE="qwen3-moe": where a 512-token prefill goes, while llama.cpp builds
  timeout 120 python3 scripts/profile_decode.py /tmp/models/$m.gguf --prefill 512 > "$OUT/profile-prefill-$m.txt" 2>&1
  echo "prefill profile $m $(el)s"; grep -A14 "^prefill" "$OUT/profile-prefill-$m.txt" | cut -c1-110
done
while ! grep -q "llama.cpp build rc" /tmp/llama.cpp/build.log 2>/dev/null && [ "$(el)" -lt 520 ]; do sleep 5; done
grep "llama.cpp build rc" /tmp/llama.cpp/build.log || echo "llama.cpp not built by $(el)s"
for m in $MODELS; do
  peak_mib "llama.cpp-$m" timeout $(( 585 - $(el) )) bash /tmp/llamacpp/bench.sh /tmp/models/$m.gguf \
    >> "$OUT/llama.json" 2>> "$OUT/llama.err"
  [ "${PP4096:-0}" = 0 ] || timeout $(( 590 - $(el) )) /tmp/llama.cpp/build/bin/llama-bench -m /tmp/models/$m.gguf -p 4096 -n 0 \
    -r 3 -fa 1 -o json >> "$OUT/llama.json" 2>> "$OUT/llama.err"
done
python3 - "$OUT" $MODELS <<'PY'
import json, sys
out = sys.argv[1]
text, dec, i = open(f"{out}/llama.json").read(), json.JSONDecoder(), 0
while (j := text.find("[", i)) >= 0:  # llama-bench prints one JSON array per run
    try:
        rows, i = dec.raw_decode(text, j)
    except ValueError as e:
        print("llama.json:", e)
        break
    for r in rows:
        print(f"llama.cpp {r['model_filename'].split('/')[-1]:<14} pp {r['n_prompt']:>3} tg {r['n_gen']:>3} "
              f"depth {r.get('n_depth', 0):>4}: {r['avg_ts']:,.1f} tok/s")
for m in sys.argv[2:]:
    try:
        r = json.load(open(f"{out}/bench-{m}.json"))
    except (OSError, ValueError) as e:
        print("memra", m, e)
        continue
    keys = ["pp512_tok_s", "tg128_graph_tok_s", "tg128_decode_sample_default_sampling_tok_s", "tg128_graph_at_4096_tok_s",
            "tg128_at_4096_tok_s", "vram_used_mib"]
    try:
        r.update(json.load(open(f"{out}/bench4k-{m}.json")))
    except (OSError, ValueError):
        pass
    keys.insert(1, "pp4096_tok_s")
    print(f"memra {m:<9}", "  ".join(f"{k.replace('_tok_s', '')}={r[k]:,.1f}" for k in keys if k in r))
PY
echo "peak VRAM while running (MiB, nvidia-smi memory.used above idle):"; cat "$OUT/vram-peak.txt"
