#!/usr/bin/env bash
# The checks that need a CUDA device, as one run on a lent GPU machine (see docs/results/gpu_speed.md).
#
#   bash benchmarks/gpu_checks.sh OUTDIR
#
# 1. the CUDA-specific tests: the Triton kernels compiled for the device (not interpreted), the
#    backend dispatch on CUDA, the conv / recurrent stacks, the trainer and fit_svi on CUDA
#    against the CPU (tests/test_cuda.py), the NCCL collectives of the distributed plumbing, and
#    the validation on a machine that has CUDA;
# 2. benchmarks/gpu_speed.py (one layer and a training step, float32 and float64 algebra);
# 3. the CI test selection on a machine with CUDA (tests that behave differently there).
# Packages the machine lacks travel as wheels in .whl/ (pyro-ppl, pyro-api, arviz and the
# arviz dependencies), installed into /tmp/site. Each step has its own time limit and its log
# goes to OUTDIR.
set -u
out=${1:?usage: gpu_checks.sh OUTDIR}
mkdir -p "$out"
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv | tee "$out/env.txt"
python3 -c "import torch, triton, pyro, numba, sys; print(sys.version.split()[0], 'torch', \
torch.__version__, 'triton', triton.__version__, 'pyro', pyro.__version__, 'numba', \
numba.__version__, torch.cuda.get_device_name())" | tee -a "$out/env.txt"
nproc | tee -a "$out/env.txt"

echo "== 1. CUDA tests"
timeout "${GPU_TESTS_S:-150}" python3 -m pytest -q -p no:cacheprovider -m "not slow" \
    tests/moments/test_fused.py tests/moments/test_backend.py tests/test_validation.py \
    tests/layers/test_respond.py tests/test_cuda.py \
    tests/inference/test_trainer.py 2>&1 | tee "$out/tests_cuda.log" | tail -25
timeout 90 python3 -m pytest -q -p no:cacheprovider -m slow -k compile_for_gpu \
    tests/moments/test_fused.py 2>&1 | tail -5
timeout 90 python3 -m pytest -q -p no:cacheprovider -k nccl \
    tests/inference/test_distributed.py 2>&1 | tee "$out/tests_nccl.log" | tail -5

echo "== 2. gpu_speed"
timeout "${GPU_SPEED_S:-200}" python3 benchmarks/gpu_speed.py --skip-compile --warmup 2 \
    --reps 30 --budget 0.5 --out "$out/gpu_speed.md" 2>&1 | tee "$out/gpu_speed.log" \
    | grep -v "^|" | tail -40

echo "== 3. the CI selection with CUDA present"
OMP_NUM_THREADS=1 timeout "${GPU_SUITE_S:-120}" python3 -m pytest -q -p no:cacheprovider -n 12 \
    -m "not slow and not gpu" tests 2>&1 | tee "$out/suite_cuda.log" | tail -25
