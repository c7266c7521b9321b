#!/usr/bin/env bash
# Three daemons in a ring on this machine, started by hand, watched with `dacflnode status`.
#   examples/local_cluster.sh            (synthetic data, 30 rounds, about a minute)
set -euo pipefail
DIR=${1:-runs/local-cluster}
DACFL=${DACFL:-dacflnode}
rm -rf "$DIR"
$DACFL topology ring --nodes 3 --out "$DIR" --dataset synthetic --model tiny-cnn --lr 0.05 \
    --rounds 30 --base-port 17000 --control-base-port 18000
pids=()
for i in 0 1 2; do
  $DACFL start --peers "$DIR/node-$i.yaml" --log-level WARNING &
  pids+=($!)
done
trap 'kill -TERM "${pids[@]}" 2>/dev/null || true' INT TERM
sleep 5
$DACFL status --peers "$DIR/node-0.yaml"
wait "${pids[@]}"
echo "final models: $DIR/node-*/final.safetensors; metrics: $DIR/node-*/metrics.jsonl"
