#!/usr/bin/env bash
# UCI benchmark cells as parallel processes, one per (set, split), each on one thread:
# the way to spend a many-core machine on benchmarks/uci.py (used on the lent GPU machine's
# 16 CPU cores for the large sets' bgpn_auto cells; docs/results/uci.md section 28).
#
#   bash benchmarks/uci_parallel.sh OUTDIR MODEL SECONDS SET:SPLIT [SET:SPLIT ...]
#
# Every process writes its finished cell to OUTDIR/uci_runs (atomically, by uci.py) and its log
# to OUTDIR/logs; a process still running after SECONDS is stopped (its cell is not written).
# Packages the machine lacks travel as wheels in .whl/ and are installed into /tmp/site; the
# datasets are read from $PYRO_GPN_UCI_DIR (default: shared/datasets in the checkout).
set -u
out=${1:?usage: uci_parallel.sh OUTDIR MODEL SECONDS SET:SPLIT ...}
model=${2:?model}
seconds=${3:?seconds}
shift 3
mkdir -p "$out/uci_runs" "$out/logs"
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PWD
fi
export PYRO_GPN_UCI_DIR=${PYRO_GPN_UCI_DIR:-$PWD/shared/datasets}
export OMP_NUM_THREADS=1 NUMBA_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONUNBUFFERED=1
(nproc; lscpu | grep -E "Model name|^CPU\(s\)") | tee "$out/cpu.txt"
for cell in "$@"; do
    set_name=${cell%%:*}
    split=${cell##*:}
    timeout "$seconds" python3 benchmarks/uci.py --sets "$set_name" --splits "$split" \
        --models "$model" --out "$out/uci_runs" >"$out/logs/${set_name}_${split}.log" 2>&1 &
done
wait
ls "$out/uci_runs"
