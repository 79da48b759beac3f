#!/usr/bin/env bash
# Prefill beside llama.cpp, in two back-to-back device calls (issue 16's pp512 rows):
#   PHASE=1: start llama.cpp's build (detached, niced), install memra, write the synthetic llama-8b
#            (Q4_K_M and Q8_0) and llama-1b files, run test_gemm.py and the GEMM microbenchmark, then
#            memra-bench pp512 with MEMRA_GEMM=gemm3 (the old default) and the default tile.
#   PHASE=2: (the machine still warm) wait for the build, then llama-bench pp512 and memra-bench pp512
#            on the same files, one after the other, and a short table.
# LLAMA=0 skips the build in phase 1, SUITE=1 runs the whole GPU suite after it,
# ONLY_8B=1 takes the Q4_K_M 8B alone, GEMM_QUICK=1 one GEMM shape a type, PP4096=1 adds 4,096-token
# prompts to phase 2 (both engines). Carry [".whl", "build/prebuilt"], with ../shared/device/llamacpp
# copied into .whl/.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/memra-out}
mkdir -p "$OUT" /tmp/models
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s]"; }
files=(/tmp/models/llama-8b.gguf /tmp/models/llama-8b-q8_0.gguf /tmp/models/llama-1b.gguf)
[ "${ONLY_8B:-0}" != 0 ] && files=(/tmp/models/llama-8b.gguf)  # ONLY_8B=1: the Q4_K_M 8B alone
pp() { python3 -c "import json,sys; print(round(json.load(open(sys.argv[1]))['pp512_tok_s'], 1))" "$1" 2>/dev/null || echo "-"; }
if [ "${PHASE:-1}" = 1 ]; then
  [ "${LLAMA:-1}" = 0 ] || [ -f /tmp/llama.cpp/build.log ] || { cp -r .whl/llamacpp /tmp/ && (setsid nohup nice -n 19 bash /tmp/llamacpp/build.sh > /dev/null 2>&1 < /dev/null &); }
  MEMRA_TESTS=0 MEMRA_BENCH=0 bash scripts/device_run.sh > "$OUT/setup.log" 2>&1 || { tail -20 "$OUT/setup.log"; exit 1; }
  echo "$(el) installed"
  export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
  ( [ -f "${files[0]}" ] || python3 -m memra_engine.model.synthetic "${files[0]}" --preset llama-8b --quiet --threads 8
    [ ${#files[@]} = 1 ] || [ -f "${files[1]}" ] || python3 -m memra_engine.model.synthetic "${files[1]}" --preset llama-8b --quant Q8_0 --quiet --threads 8
    [ ${#files[@]} = 1 ] || [ -f "${files[2]}" ] || python3 -m memra_engine.model.synthetic "${files[2]}" --preset llama-1b --quiet --threads 8
  ) > "$OUT/synth.log" 2>&1 &
  synth=$!
  python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_gemm.py > "$OUT/test_gemm.log" 2>&1
  echo "$(el) test_gemm: $(tail -1 "$OUT/test_gemm.log")"
  grep -E "^FAILED|Error" "$OUT/test_gemm.log" | head -8
  python3 scripts/bench_kernels.py --gemm-only ${GEMM_QUICK:+--quick} > "$OUT/gemm.txt" 2>&1
  grep "^gemm" "$OUT/gemm.txt"
  wait $synth; echo "$(el) models written"
  for f in "${files[@]}"; do
    n=$(basename "$f" .gguf)
    for tile in ${TILES:-gemm3 default}; do  # TILES="gemm3 default gemm7": any MEMRA_GEMM tiles beside the default
      if [ $tile = default ]; then env=MEMRA_GEMM=; else env=MEMRA_GEMM=$tile; fi
      env $env python3 -m memra_engine.bench "$f" --backend cuda --runs 3 --n-gen 8 --json > "$OUT/pp-$n-$tile.json" 2>> "$OUT/misc.log"
      echo "$(el) $n $tile pp512 $(pp "$OUT/pp-$n-$tile.json")"
    done
  done
  if [ "${SUITE:-0}" != 0 ]; then  # SUITE=1: the whole GPU suite last
    timeout 330 python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu > "$OUT/pytest.log" 2>&1
    echo "$(el) pytest -m gpu: $(tail -1 "$OUT/pytest.log")"
    grep -E "^FAILED|^ERROR" "$OUT/pytest.log" | head -10
  fi
else
  export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
  while ! grep -q "llama.cpp build rc" /tmp/llama.cpp/build.log 2>/dev/null; do sleep 5; done
  echo "$(el) $(grep 'llama.cpp build rc' /tmp/llama.cpp/build.log)"
  for f in "${files[@]}"; do
    n=$(basename "$f" .gguf)
    plens=512; [ "${PP4096:-0}" != 0 ] && plens=512,4096
    /tmp/llama.cpp/build/bin/llama-bench -m "$f" -p $plens -n 0 -r 5 -fa 1 -o json > "$OUT/llama-$n.json" 2>> "$OUT/misc.log"
    python3 -m memra_engine.bench "$f" --backend cuda --runs 5 --n-gen 8 --json > "$OUT/pp2-$n.json" 2>> "$OUT/misc.log"
    [ "${PP4096:-0}" != 0 ] && python3 -m memra_engine.bench "$f" --backend cuda --runs 3 --n-prompt 4096 --n-gen 8 --json > "$OUT/pp4k-$n.json" 2>> "$OUT/misc.log"
    MEMRA_GEMM=gemm3 python3 -m memra_engine.bench "$f" --backend cuda --runs 3 --n-gen 8 --json > "$OUT/pp3-$n.json" 2>> "$OUT/misc.log"
    echo "$n gemm3 pp512 $(pp "$OUT/pp3-$n.json")"
    python3 - "$OUT/llama-$n.json" "$OUT/pp2-$n.json" "$n" "$OUT/pp4k-$n.json" <<'PY'
import json, os, sys
ll = json.load(open(sys.argv[1]))
for n_prompt, path in ((512, sys.argv[2]), (4096, sys.argv[4])):
    if not os.path.exists(path):
        continue
    l = [r["avg_ts"] for r in ll if r.get("n_prompt") == n_prompt][0]
    m = json.load(open(path))[f"pp{n_prompt}_tok_s"]
    print(f"{sys.argv[3]:<18} llama.cpp pp{n_prompt} {l:9.1f}   memra pp{n_prompt} {m:9.1f}   {m / l:.2f}x")
PY
  done
fi
