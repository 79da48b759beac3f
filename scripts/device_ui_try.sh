#!/usr/bin/env bash
# Try memra-chat in a terminal on the GPU machine, as a user would (after scripts/device_run.sh
# installed memra into /tmp/site): tmux from .whl/tmux, the chat on MODEL with the given flags,
# one prompt typed in, the screen captured mid-reply and after it into $OUT/screen-*.txt.
# Usage: bash scripts/device_ui_try.sh MODEL "PROMPT" [memra-chat flags...]   (MID_S, AFTER_S: seconds
# from Enter to the mid-reply capture, then to the last one; defaults 0.7 and 6)
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
# pasted (bracketed), not typed: send-keys refuses a prompt of a few thousand characters ("command too long")
printf '%s' "$prompt" > /tmp/ui-prompt.txt
tmux load-buffer -b prompt /tmp/ui-prompt.txt
tmux paste-buffer -p -d -b prompt -t chat
sleep 0.5
tmux send-keys -t chat Enter
sleep ${MID_S:-0.7}
tmux capture-pane -p -t chat > "$OUT/screen-mid.txt"
sleep ${AFTER_S:-6}
tmux capture-pane -p -t chat > "$OUT/screen-after.txt"
tmux kill-session -t chat
