#!/usr/bin/env bash
# Issue 16's "real app on the GPU": memra-chat itself in tmux on the GPU machine, a long prompt
# pasted in one go (bracketed paste, as a user pastes a document) and two short turns after it,
# the screen captured after each reply into $OUT/app-NAME-N.txt; then memra-bench on the same file
# (pp at the prompt's length; tg128 on the engine path at default knobs, after a one-token prompt
# and after the prompt's length of context, as reply 1 decodes) so the panes' TTFT and decode tok/s
# can be set beside what the benchmark predicts. Run after scripts/device_run.sh installed memra. When a turn
# outgrows the context (a random-weight reply of 512 tokens can re-tokenize to 2,000+), the app asks
# to drop the oldest turn; this answers y, as a user would, and says so.
# MEMRA_APP_FLAGS: more memra-chat flags; MEMRA_APP_BENCH_FLAGS: more memra-bench flags (a budgeted
# MoE run: MEMRA_APP_FLAGS="--moe-vram 1GiB" MEMRA_APP_BENCH_FLAGS="--moe-share 0.2", about that share).
# Usage: bash scripts/device_app_check.sh NAME MODEL.gguf [PROMPT_REPEATS]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/memra-out}
name=$1 model=$2 repeats=${3:-65}
PY=${PYTHON:-python3} backend=${MEMRA_APP_BACKEND:-cuda}  # a dry run here: PYTHON=.venv/bin/python MEMRA_APP_BACKEND=cpu
mkdir -p "$OUT"
# the GPU machine has no Textual: .whl must carry it and its needs (the names below)
PYTHONPATH=/tmp/site $PY -c "import textual" 2>/dev/null || {
  echo "$name: textual is not installed: run ../shared/device/prepare.sh textual rich markdown-it-py mdit-py-plugins" \
       "linkify-it-py uc-micro-py pygments mdurl typing_extensions here, then carry .whl"; exit 1; }
export PYTHONPATH=/tmp/site XDG_DATA_HOME=/tmp/xdg-$name XDG_CONFIG_HOME=/tmp/xdgc-$name
[ -x /tmp/tmuxroot/usr/bin/tmux ] || for f in .whl/tmux/*.deb; do dpkg -x "$f" /tmp/tmuxroot; done
export PATH=/tmp/tmuxroot/usr/bin:$PATH LD_LIBRARY_PATH=/tmp/tmuxroot/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
python3 - "$repeats" > /tmp/prompt-$name.txt <<'PY'
import sys
para = ("The harbour town woke slowly. Fishing boats knocked against the pier, gulls argued over the nets, "
        "and the baker opened his shutters to the smell of bread and salt. ")
print("Summarise this story in two sentences.\n\n" + para * int(sys.argv[1]), end="")
PY
# capture N: the screen (the pane stays after the app exits, so a crash shows its last words)
capture() {
  tmux capture-pane -p -t "$name" > "$OUT/app-$name-$1.txt" || echo "$name: no pane to capture ($1)"
  grep -q "memra-chat exited" "$OUT/app-$name-$1.txt" && { echo "$name: the app exited:"; grep -v "^\s*$" "$OUT/app-$name-$1.txt" | tail -8; }
}
# wait_reply N: until the chat file holds N finished replies (one streaming is saved "interrupted")
wait_reply() {
  for _ in $(seq 1 240); do
    sleep 0.5
    if tmux capture-pane -p -t "$name" | grep -q "outgrown the context"; then
      echo "$name: turn $1 outgrew the context: answered y (drop the oldest turn)"; tmux send-keys -t "$name" y
    fi
    python3 - "$XDG_DATA_HOME/memra/chats" "$1" <<'PY' && return 0
import json, pathlib, sys
files = sorted(pathlib.Path(sys.argv[1]).glob("*.json"))
done = [m for m in json.loads(files[-1].read_text())["messages"]
        if m["role"] == "assistant" and m["status"] != "interrupted"] if files else []
sys.exit(0 if len(done) >= int(sys.argv[2]) else 1)
PY
  done
  echo "$name: reply $1 did not finish in 120 s"
}
tmux new-session -d -s "$name" -x 160 -y 48 \
  "$PY -c 'import sys; from memra_tui.cli import main; sys.exit(main())' $model --backend $backend --ctx 8192 ${MEMRA_APP_FLAGS:-}; echo memra-chat exited \$?"
tmux set-option -t "$name" remain-on-exit on
for _ in $(seq 1 90); do sleep 0.5; tmux capture-pane -p -t "$name" | grep -q "Send" && break; done
capture 0  # the screen before the prompt: the model loaded, or why not
tmux load-buffer /tmp/prompt-$name.txt && tmux paste-buffer -p -t "$name" && sleep 0.5 && tmux send-keys -t "$name" Enter
wait_reply 1; capture 1
tmux send-keys -t "$name" "Now in one sentence." Enter; wait_reply 2
tmux send-keys -t "$name" "Give the story a title." Enter; wait_reply 3; capture 3
tmux kill-session -t "$name"
n_prompt=$(grep -o "[0-9,]* / 8,192 tokens" "$OUT/app-$name-1.txt" | head -1 | cut -d' ' -f1 | tr -d ,)
# the pane counts the context after reply 1 (prompt + reply): a reply cut at max tokens took exactly max_tokens
n_prompt=$(python3 - "$XDG_DATA_HOME/memra/chats" "${n_prompt:-0}" <<'PY'
import json, pathlib, sys
files = sorted(pathlib.Path(sys.argv[1]).glob("*.json"))
replies = [m for m in json.loads(files[-1].read_text())["messages"] if m["role"] == "assistant"] if files else []
used = int(sys.argv[2])
cut = replies and replies[0]["status"] == "length"
print(used - replies[0]["sampling"]["max_tokens"] if cut and used else used or "")
PY
)
$PY -m memra_engine.bench "$model" --backend $backend --runs 3 --n-prompt "${n_prompt:-4000}" \
  --ctx-depth "${n_prompt:-4000}" --json ${MEMRA_APP_BENCH_FLAGS:-} \
  > "$OUT/bench-app-$name.json" 2>> "$OUT/misc.log"
python3 - "$OUT" "$name" "${n_prompt:-4000}" <<'PY'
import json, pathlib, re, sys
out, name, n = pathlib.Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
r = json.loads((out / f"bench-app-{name}.json").read_text())
first, last = [(out / f"app-{name}-{i}.txt").read_text() for i in (1, 3)]
def pane(text, label):
    m = re.search(rf"{label}\s+([\d,.]+) (tok/s|ms)", text)
    return float(m.group(1).replace(",", "")) if m else float("nan")
pp = r.get(f"pp{n}_tok_s", float("nan"))
ttft, predicted = pane(first, "TTFT"), 1000 * n / pp
# the GPU backend's engine path (decode_sample, default knobs); the CPU backend has only plain decode
engine = r.get("tg128_decode_sample_default_sampling_tok_s", r.get("tg128_tok_s", float("nan")))
deep = r.get(f"tg128_decode_sample_default_sampling_at_{n}_tok_s", r.get(f"tg128_at_{n}_tok_s", float("nan")))
d1 = pane(first, "decode")
print(f"{name}: prompt {n} tokens; TTFT {ttft:.0f} ms in the pane, {predicted:.0f} ms from pp{n} {pp:,.0f} tok/s "
      f"({ttft / predicted:.2f}x); decode {d1:.1f} / {pane(last, 'decode'):.1f} tok/s in the pane (replies 1 and 3); "
      f"memra-bench engine path after {n} tokens {deep:.1f} (reply 1: {d1 / deep:.0%} of it), after 1 token {engine:.1f}")
PY
