#!/usr/bin/env bash
# Try memra-chat in a terminal on the GPU machine, as a user would (after scripts/device_run.sh
# installed memra into /tmp/site): tmux from .whl/tmux, the chat on MODEL with the given flags,
# one prompt typed in, the screen captured mid-reply and after it into $OUT/screen-*.txt.
# Usage: bash scripts/device_ui_try.sh MODEL "PROMPT" [memra-chat flags...]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/memra-out}
model=$1 prompt=$2
shift 2
for f in .whl/tmux/*.deb; do dpkg -x "$f" /tmp/tmuxroot; done
export PATH=/tmp/tmuxroot/usr/bin:$PATH LD_LIBRARY_PATH=/tmp/tmuxroot/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONPATH=/tmp/site
tmux new-session -d -s chat -x 160 -y 48 "python3 -c 'import sys; from memra_tui.cli import main; sys.exit(main())' $model --backend cuda $*; sleep 30"
sleep 15
tmux capture-pane -p -t chat > "$OUT/screen-loaded.txt"
tmux send-keys -t chat "$prompt" Enter
sleep 0.7
tmux capture-pane -p -t chat > "$OUT/screen-mid.txt"
sleep 6
tmux capture-pane -p -t chat > "$OUT/screen-after.txt"
tmux kill-session -t chat
