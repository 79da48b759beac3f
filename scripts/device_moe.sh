#!/usr/bin/env bash
# The MoE checks and benchmark on the device (issue 15): the GPU MoE tests, then memra-bench on the
# Qwen3-MoE shape of docs/design.md §7 (Q4_K_M) all resident and with MEMRA_MOE_SHARE of the experts' bytes
# in VRAM (default 0.25); MEMRA_PROFILE=1 also profiles decode and a 512-token prefill
# (scripts/profile_decode.py). Run after scripts/device_run.sh has installed to /tmp/site (MEMRA_BENCH=0).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/memra-out}
mkdir -p "$OUT" /tmp/models
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
if [ "${MEMRA_TESTS:-1}" != 0 ]; then
  stamp "pytest -m gpu (moe)"
  python3 -m pytest -m gpu -q -p no:cacheprovider -rfE tests/gpu/test_moe_kernels.py tests/gpu/test_moe_gpu.py \
    ${MEMRA_MORE_TESTS:-} > "$OUT/pytest-moe.log" 2>&1
  tail -3 "$OUT/pytest-moe.log"; grep -E "^FAILED|^ERROR" "$OUT/pytest-moe.log" | head
fi
m=/tmp/models/qwen3-moe.gguf
[ -f "$m" ] || { stamp "synthetic qwen3-moe"; python3 -m memra_engine.model.synthetic "$m" --preset qwen3-moe --quiet --threads 16; }
stamp "bench resident"
python3 -m memra_engine.bench "$m" --backend cuda --runs 3 --json > "$OUT/bench-moe-resident.json" 2>> "$OUT/misc.log"
stamp "bench share ${MEMRA_MOE_SHARE:-0.25}"
python3 -m memra_engine.bench "$m" --backend cuda --runs 3 --json --moe-share "${MEMRA_MOE_SHARE:-0.25}" \
  > "$OUT/bench-moe-share.json" 2>> "$OUT/misc.log"
if [ "${MEMRA_PROFILE:-0}" != 0 ]; then
  stamp "profile decode and a 512-token prefill"
  python3 scripts/profile_decode.py "$m" --ctx 128 > "$OUT/profile-moe.txt" 2>&1
  python3 scripts/profile_decode.py "$m" --prefill 512 >> "$OUT/profile-moe.txt" 2>&1
  head -12 "$OUT/profile-moe.txt"; grep -A14 "^prefill" "$OUT/profile-moe.txt"
fi
stamp "done"
python3 - "$OUT" <<'PY'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
keys = ["pp512_tok_s", "tg128_tok_s", "tg128_graph_tok_s", "tg128_decode_sample_tok_s",
        "tg128_decode_sample_default_sampling_tok_s", "moe_hit_rate", "moe_copy_gb_s", "moe_resident", "vram_used_mib"]
for name in ("resident", "share"):
    p = out / f"bench-moe-{name}.json"
    if not p.exists() or not p.read_text().strip():
        print(name, "no result"); continue
    r = json.loads(p.read_text())
    print(name, " ".join(f"{k}={round(r[k], 1) if isinstance(r.get(k), float) else r.get(k)}" for k in keys))
PY
