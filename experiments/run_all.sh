#!/usr/bin/env bash
# Run every experiment, one at a time, cheapest first, at the given scale (default cpu) and seed (default 1).
# Logs go to $WORK/logs (default /tmp/ldpfl-experiments/logs); results to docs/results/.
set -euo pipefail
cd "$(dirname "$0")/.."
SCALE=${1:-cpu}
SEED=${2:-1}
WORK=${LDPFL_EXPERIMENTS_WORK:-/tmp/ldpfl-experiments}
PY=.venv/bin/python
mkdir -p "$WORK/logs"
step() { local name=$1; shift; echo "[$(date +%T)] start $name"; "$PY" "$@" --scale "$SCALE" --seed "$SEED" \
  > "$WORK/logs/$name.log" 2>&1; echo "[$(date +%T)] end $name"; }
step exp2 experiments/exp2_wu_personalized.py
step exp2-supplement experiments/exp2_wu_personalized.py --part supplement
step exp4 experiments/exp4_dpfedaw.py
step exp3 experiments/exp3_pldpfl.py
step exp1-mnist experiments/exp1_ldpfl.py --part mnist
step exp5 experiments/exp5_privacy_utility.py
step exp1-fmnist experiments/exp1_ldpfl.py --part fmnist
# budget sweeps (deviations from the papers, docs/RESULTS.md sections 2 and 3) and two-client MNIST at full scale
step exp2-sweep experiments/exp2_wu_personalized.py --part sweep
step exp3-sweep experiments/exp3_pldpfl.py --part sweep
step exp1-mnist-full experiments/exp1_ldpfl.py --part mnist-full
# run-to-run spread: the DP-FedAW comparison again with seed + 1, in its own work and results directories
"$PY" experiments/exp4_dpfedaw.py --scale "$SCALE" --seed $((SEED + 1)) --work "$WORK/seed$((SEED + 1))" \
  --out "docs/results/seed$((SEED + 1))" > "$WORK/logs/exp4-seed$((SEED + 1)).log" 2>&1
