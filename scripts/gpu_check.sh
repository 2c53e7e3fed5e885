#!/usr/bin/env bash
# The checks that need a CUDA device, in one go (a lent GPU machine bills by the minute, and
# the default steps end within 8 minutes): the GPU tests (CuPy and torch CUDA tensors as
# Level-1) and the stand-in tests beside them, bench_gpu at 64 MiB states, and checkpoint_scan
# on a CUDA LSTM language model at n = 1000 and 10000 (bench_torch_gpu); the paper's LSTM on
# the device on request. Run from the repository root with a Python that has torch and CuPy;
# logs go to $OUT (or results/gpu). Usage: scripts/gpu_check.sh [steps...]
# (steps: info tests bench torch lstm; default: info tests bench torch)
set -u
out=${OUT:-results/gpu}
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
python=${PYTHON:-python3}
steps=${*:-info tests bench torch}

for step in $steps; do
  echo "=== $step"
  case $step in
    info)
      nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
      $python -c 'import sys, numpy, cupy, torch; print(sys.version.split()[0], "numpy", numpy.__version__, "cupy", cupy.__version__, "torch", torch.__version__, "cuda", torch.version.cuda)'
      ;;
    tests)
      timeout 150 $python -m pytest -q -p no:cacheprovider --durations=5 \
        tests/test_asyncckpt/execution/test_gpu.py tests/test_asyncckpt/execution/test_device.py \
        tests/test_asyncckpt/pytorch/test_torch_cuda.py \
        2>&1 | tee "$out/tests.log" | tail -40
      ;;
    bench)
      timeout 120 $python benchmarks/bench_gpu.py --device cuda --mib 64 ${BENCH_ARGS:-} \
        2>&1 | tee "$out/bench_gpu.log" | tail -5
      ;;
    torch)
      # every method at n = 1000 (3 repeats, about 40 s on an H100); at n = 10000 the scan
      # and the forward alone, once (plain autograd and save_on_cpu ran past 170 s there)
      timeout 90 $python benchmarks/bench_torch_gpu.py --n 1000 ${TORCH_ARGS:-} \
        2>&1 | tee "$out/bench_torch_gpu.log" | tail -3
      timeout 150 $python benchmarks/bench_torch_gpu.py --n 10000 --repeats 1 --plain-max 1000 \
        ${TORCH_ARGS:-} 2>&1 | tee -a "$out/bench_torch_gpu.log" | tail -3
      ;;
    lstm)
      timeout 200 $python -m experiments.lstm --device cuda --lengths 100 800 --repeats 3 \
        --out "${LSTM_OUT:-/tmp/asyncckpt-lstm}" 2>&1 | tee "$out/lstm.log" | tail -30
      ;;
    *) echo "unknown step $step" >&2; exit 2 ;;
  esac
done
