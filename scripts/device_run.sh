#!/usr/bin/env bash
# Everything the GPU machine does for memra, in one call (see shared/device/README.md):
#   install the carried wheels (.whl) and memra itself into /tmp/site, build the fatbins for
#   this GPU, run `pytest -m gpu` (all of tests/gpu, or the tests given as arguments), generate
#   the synthetic benchmark models, run memra-bench --backend cuda on the SmolLM2 and Gemma3
#   shapes, and print a short table last. Logs go to $OUT (the device tool brings them back).
# Usage: bash scripts/device_run.sh [pytest args...]     MEMRA_BENCH=0 skips the benchmarks,
#        MEMRA_TESTS=0 skips the tests, MEMRA_BENCH_FIRST=1 runs the benchmarks before the tests,
#        MEMRA_BENCH_SAMPLER=1 times the sampler alone (scripts/bench_sampler.py),
#        MEMRA_BENCH_GRAMMAR=1 runs scripts/bench_grammar.py (decode with / without a JSON schema)
#        on each benchmark shape (MEMRA_BENCH_SHAPES="smollm2-135m llama-8b" picks the shapes),
#        MEMRA_PROFILE_FLAGS="--ctx 128 --verify 9" sets profile_decode.py's flags (MEMRA_PROFILE=1),
#        MEMRA_BENCH_SPEC=1 runs scripts/bench_spec.py: the verify cost on each shape, prompt lookup
#        on the real SmolLM2 (when carried) and draft-model pairs (MEMRA_BENCH_TOOLS=0 skips memra-bench).
#        Model parts in .models/ (scripts/model_parts.py) are joined first, for tests/gpu/test_real_model_gpu.py.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/memra-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
SITE=/tmp/site
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }

stamp "install"
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$SITE" .whl/*.whl || exit 1
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target "$SITE" . \
  >> "$OUT/misc.log" 2>&1 || { tail -20 "$OUT/misc.log"; exit 1; }
export PYTHONPATH="$SITE"
if [ -d build/prebuilt ]; then  # sm_90a fatbins built here (carry "build/prebuilt"); used only if their source key matches
  mkdir -p "$SITE/memra_engine/kernels/prebuilt" && cp build/prebuilt/* "$SITE/memra_engine/kernels/prebuilt/"
fi
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv,noheader
if compgen -G ".models/*.part*" > /dev/null; then  # the real SmolLM2, carried in parts over two calls (README)
  mkdir -p /tmp/models && real=$(python3 scripts/model_parts.py join .models /tmp/models) \
    && export MEMRA_REAL_SMOLLM2="$real" && stamp "joined $real"
fi

stamp "build fatbins (sm_90a, all families in parallel)"
arch=$(python3 -c "import pycuda.driver as c; c.init(); from memra_engine.gpu.build import arch_for_capability as a; print(a(*c.Device(0).compute_capability()))")
python3 -m memra_engine.gpu.build "$arch" 2>&1 | grep -v '^building' | tee -a "$OUT/misc.log"

run_tests() {
  if [ "${MEMRA_TESTS:-1}" != 0 ]; then
    stamp "pytest -m gpu ${*:-tests/gpu}"
    python3 -m pytest -m gpu -v -p no:cacheprovider -rfE --durations=8 -s "${@:-tests/gpu}" > "$OUT/pytest.log" 2>&1
    test_rc=$?
    grep -E "rel err|passed|failed|error|FAILED|ERROR|Error" "$OUT/pytest.log" | tail -40
  fi
}

run_bench() {
  if [ "${MEMRA_BENCH:-1}" != 0 ]; then
    mkdir -p /tmp/models
    for shape in ${MEMRA_BENCH_SHAPES:-smollm2-135m gemma3-270m}; do
      stamp "synthetic $shape"
      [ -f "/tmp/models/$shape.gguf" ] || python3 -m memra_engine.model.synthetic "/tmp/models/$shape.gguf" \
          --preset "$shape" --quiet >> "$OUT/misc.log" 2>&1 || { tail -5 "$OUT/misc.log"; continue; }
      if [ "${MEMRA_BENCH_TOOLS:-1}" != 0 ]; then
        stamp "memra-bench --backend cuda $shape"
        python3 -m memra_engine.bench "/tmp/models/$shape.gguf" --backend cuda --ctx-depth 4096 --runs 5 --json \
          > "$OUT/bench-$shape.json" 2>> "$OUT/misc.log" || { tail -5 "$OUT/misc.log"; continue; }
        bench_rows+=("$shape")
      fi
      if [ "${MEMRA_BENCH_SPEC:-0}" != 0 ]; then
        stamp "spec verify cost $shape"
        python3 scripts/bench_spec.py verify "/tmp/models/$shape.gguf" > "$OUT/spec-verify-$shape.txt" 2>&1
      fi
      if [ "${MEMRA_BENCH_GRAMMAR:-0}" != 0 ]; then
        stamp "grammar bench $shape"
        python3 scripts/bench_grammar.py "/tmp/models/$shape.gguf" --backend cuda --runs 5 > "$OUT/grammar-$shape.txt" 2>&1
      fi
      if [ "${MEMRA_PROFILE:-0}" != 0 ]; then
        stamp "profile $shape"
        python3 scripts/profile_decode.py "/tmp/models/$shape.gguf" ${MEMRA_PROFILE_FLAGS:---ctx 128 --ctx 4096} \
          > "$OUT/profile-$shape.txt" 2>&1
      fi
    done
    if [ "${MEMRA_BENCH_SPEC:-0}" != 0 ] && [ -n "${MEMRA_REAL_SMOLLM2:-}" ]; then
      stamp "spec lookup, real SmolLM2"
      python3 scripts/bench_spec.py lookup "$MEMRA_REAL_SMOLLM2" --draft-max "${MEMRA_SPEC_DRAFT_MAX:-4,8}" \
        > "$OUT/spec-lookup.txt" 2>&1
      stamp "spec draft, real SmolLM2 drafting for itself"
      python3 scripts/bench_spec.py draft "$MEMRA_REAL_SMOLLM2" --draft "$MEMRA_REAL_SMOLLM2" \
        > "$OUT/spec-draft-self.txt" 2>&1
    fi
    if [ "${MEMRA_BENCH_SPEC:-0}" != 0 ] && [ -f /tmp/models/llama-8b.gguf ] && [ -f /tmp/models/smollm2-135m.gguf ]; then
      stamp "spec draft, llama-8b shape with the smollm2-135m shape (random weights)"
      python3 scripts/bench_spec.py draft /tmp/models/llama-8b.gguf --draft /tmp/models/smollm2-135m.gguf \
        --max-tokens 128 --runs 1 > "$OUT/spec-draft-8b.txt" 2>&1
    fi
    if [ "${MEMRA_BENCH_SAMPLER:-0}" != 0 ]; then
      stamp "sampler alone"
      python3 scripts/bench_sampler.py > "$OUT/sampler.txt" 2>&1
    fi
  fi
}

test_rc=skipped
bench_rows=()
if [ "${MEMRA_BENCH_FIRST:-0}" != 0 ]; then run_bench; run_tests "$@"; else run_tests "$@"; run_bench; fi

stamp "done"
echo "== memra on $(nvidia-smi --query-gpu=name --format=csv,noheader) =="
[ -f "$OUT/pytest.log" ] && echo "pytest -m gpu: $(tail -1 "$OUT/pytest.log") (rc $test_rc)"
for f in "$OUT"/profile-*.txt; do [ -f "$f" ] && head -14 "$f"; done
[ -f "$OUT/sampler.txt" ] && tail -12 "$OUT/sampler.txt"
for f in "$OUT"/grammar-*.txt; do [ -f "$f" ] && echo "${f##*/}" && tail -6 "$f"; done
for f in "$OUT"/spec-*.txt; do [ -f "$f" ] && echo "${f##*/}" && tail -14 "$f"; done
for shape in "${bench_rows[@]}"; do
  python3 - "$OUT/bench-$shape.json" "$shape" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
keys = ["pp512_tok_s", "tg128_tok_s", "tg128_at_4096_tok_s", "tg128_graph_tok_s", "tg128_graph_at_4096_tok_s",
        "tg128_decode_sample_tok_s", "tg128_graph_default_sampling_tok_s",
        "tg128_decode_sample_default_sampling_tok_s", "outside_graph_share", "graph_kernels_per_token",
        "vram_used_mib"]
print(f"{sys.argv[2]:<14}" + "  ".join(f"{k.replace('_tok_s', '')}={r[k]:.1f}" if isinstance(r.get(k), float)
                                       else f"{k.replace('_tok_s', '')}={r.get(k)}" for k in keys))
PY
done
[ "$test_rc" = 0 ] || [ "$test_rc" = skipped ]
