#!/usr/bin/env bash
# The decode matvec round on the device (issues 15, 16): install and build (scripts/device_run.sh), the
# synthetic models (presets) of MEMRA_DECODE_RUNS written in the background,
# the matvec tests, scripts/bench_decode_matvecs.py on the 8B shapes (MEMRA_DECODE_MATVECS overrides
# the ROWSxCOLS:TYPE list; empty skips it), then memra-bench for each shape:switches of
# MEMRA_DECODE_RUNS (default "llama-8b:base llama-1b:base qwen3-moe:base"; switches joined by +,
# e.g. qwen3-moe:MEMRA_MOE_RU=4,1), with MEMRA_DECODE_BENCH_FLAGS added to each (e.g. "--ctx-depth 4096").
# MEMRA_DECODE_ATTN=1 also runs scripts/bench_attention.py. MEMRA_DECODE_LLAMA=1 also starts
# llama.cpp's build detached (for scripts/device_side_by_side.sh in the next call, the machine warm).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/memra-out}
mkdir -p "$OUT" /tmp/models
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
if [ "${MEMRA_DECODE_LLAMA:-0}" = 1 ] && [ ! -x /tmp/llama.cpp/build/bin/llama-bench ]; then
  cp -r .whl/llamacpp /tmp/ && (setsid nohup nice -n 19 bash /tmp/llamacpp/build.sh > /dev/null 2>&1 < /dev/null &)
fi
MEMRA_TESTS=0 MEMRA_BENCH=0 bash scripts/device_run.sh > "$OUT/setup.log" 2>&1 || { tail -20 "$OUT/setup.log"; exit 1; }
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
RUNS=${MEMRA_DECODE_RUNS-llama-8b:base llama-1b:base qwen3-moe:base}
SHAPES=$(for r in $RUNS; do echo "${r%%:*}"; done | sort -u)
pids=()
for shape in $SHAPES; do
  [ -f "/tmp/models/$shape.gguf" ] || { python3 -m memra_engine.model.synthetic "/tmp/models/$shape.gguf" \
    --preset "$shape" --quiet --threads 4 >> "$OUT/misc.log" 2>&1 & pids+=($!); }
done
if [ "${MEMRA_TESTS:-1}" != 0 ]; then
  tests=${MEMRA_DECODE_TESTS:-tests/gpu/test_matvec.py tests/gpu/test_moe_kernels.py}
  stamp "pytest -m gpu $tests"
  python3 -m pytest -m gpu -q -p no:cacheprovider -rfE $tests > "$OUT/pytest-decode.log" 2>&1
  tail -2 "$OUT/pytest-decode.log"; grep -E "^FAILED|^ERROR" "$OUT/pytest-decode.log" | head -12
fi
MATVECS=${MEMRA_DECODE_MATVECS-28672x4096:Q4_K 4096x14336:Q4_K 4096x4096:Q4_K 6144x4096:Q4_K 4096x14336:Q6_K 49152x4096:Q6_K 1024x4096:Q6_K 28672x4096:Q8_0 16384x2048:Q4_K 2048x8192:Q4_K}
if [ -n "$MATVECS" ]; then
  stamp "bench_decode_matvecs"
  python3 scripts/bench_decode_matvecs.py $MATVECS > "$OUT/matvecs.txt" 2>&1
  grep "^matvec" "$OUT/matvecs.txt" || tail -5 "$OUT/matvecs.txt"
fi
if [ "${MEMRA_DECODE_ATTN:-0}" = 1 ]; then
  stamp "bench_attention"
  python3 scripts/bench_attention.py > "$OUT/attention.txt" 2>&1; tail -30 "$OUT/attention.txt"
fi
for p in "${pids[@]}"; do wait "$p"; done
n=0
for run in $RUNS; do  # shape:switches (joined by +) or shape:base
  n=$((n + 1)) shape=${run%%:*} ab=${run#*:} envs=()
  [ "$ab" = base ] || IFS=+ read -ra envs <<< "$ab"
  stamp "memra-bench $shape $ab"
  env "${envs[@]}" timeout 150 python3 -m memra_engine.bench "/tmp/models/$shape.gguf" --backend cuda --runs 5 \
    ${MEMRA_DECODE_BENCH_FLAGS:-} --json > "$OUT/bench-$n.json" 2>> "$OUT/misc.log"
  python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[2], sys.argv[3], {k: round(v, 1) for k, v in r.items() if k.endswith('tok_s')})" \
    "$OUT/bench-$n.json" "$shape" "$ab" || tail -3 "$OUT/misc.log"
done
stamp done
