#!/usr/bin/env bash
# A same-call A/B against an older commit: memra-bench on the tree in ab/old.tar (made here with
# `git archive -o ab/old.tar REV pyproject.toml engine cuda memra_tui README.md assets`, and optionally
# that tree's fatbins: `python3 scripts/build_prebuilt.py ab/prebuilt` in a checkout of REV; carry
# ["ab", ".whl"]), installed beside this tree's /tmp/site, on models already in /tmp/models. Run after
# scripts/device_decode.sh (or device_run.sh) installed this tree. Extra memra-bench flags: MEMRA_AB_FLAGS.
# Usage: bash scripts/device_ab.sh SHAPE...   (e.g. llama-8b qwen3-moe)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/memra-out}
mkdir -p "$OUT"
rm -rf /tmp/old && mkdir /tmp/old && tar -xf ab/old.tar -C /tmp/old || exit 1
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target /tmp/site-old /tmp/old \
  > "$OUT/ab-pip.log" 2>&1 || { tail -5 "$OUT/ab-pip.log"; exit 1; }
if [ -d ab/prebuilt ]; then  # the old tree's sm_90a fatbins, built here like build/prebuilt (used if their key matches)
  mkdir -p /tmp/site-old/memra_engine/kernels/prebuilt && cp ab/prebuilt/* /tmp/site-old/memra_engine/kernels/prebuilt/
fi
for m in "$@"; do
  # the old tree first on the path; its kernels build into the user cache under their own source key
  PYTHONPATH=/tmp/site-old:/tmp/site timeout 200 python3 -m memra_engine.bench "/tmp/models/$m.gguf" --backend cuda \
    --runs 5 ${MEMRA_AB_FLAGS:---ctx-depth 4096} --json > "$OUT/old-$m.json" 2>> "$OUT/misc.log"
  python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print('old', sys.argv[2], {k: round(v, 1) for k, v in r.items() if k.endswith('tok_s')})" \
    "$OUT/old-$m.json" "$m" || tail -3 "$OUT/misc.log"
done
