#!/usr/bin/env bash
# Four daemons in a ring on this machine, on Fashion-MNIST, started by hand and watched with
# `dacflnode status`; JSON logs; a report at the end. See README.md beside this file.
#   examples/local-cluster/run.sh [DIR] [topology flags...]
#   examples/local-cluster/run.sh runs/quick --dataset synthetic --model tiny-cnn --rounds 3
set -euo pipefail
DIR=${1:-runs/local-cluster}
shift || true
DACFL=${DACFL:-dacflnode}
NODES=4
rm -rf "$DIR"
$DACFL topology ring --nodes $NODES --out "$DIR" --dataset fashion-mnist --model mlp \
    --lr 0.05 --rounds 20 --base-port 17000 --control-base-port 18000 "$@"
pids=()
for ((i = 0; i < NODES; i++)); do
  # the node logs to DIR/node-i/daemon.log and to stderr, one JSON object per line
  $DACFL start --peers "$DIR/node-$i.yaml" --log-format json 2>"$DIR/node-$i.stderr" &
  pids+=($!)
done
trap 'kill -TERM "${pids[@]}" 2>/dev/null || true' INT TERM
for _ in $(seq 300); do  # until node-0 has finished its first round (or has stopped)
  [ -s "$DIR/node-0/metrics.jsonl" ] || ! kill -0 "${pids[0]}" 2>/dev/null && break
  sleep 1
done
$DACFL status --peers "$DIR/node-0.yaml" || true
code=0
for pid in "${pids[@]}"; do wait "$pid" || code=$?; done
if [ "$code" -ne 0 ]; then
  echo "a node failed (exit $code): see $DIR/node-*.stderr" >&2
  exit "$code"
fi
$DACFL report "$DIR"
