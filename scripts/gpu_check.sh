#!/usr/bin/env bash
# The checks that need a CUDA device, in one go (a lent GPU machine bills by the minute):
# the GPU tests, the stand-in tests beside them, bench_gpu on the device and the LSTM on the
# device. Run from the repository root with a Python that has CuPy; logs go to $OUT (or
# results/gpu). Usage: scripts/gpu_check.sh [steps...]  (steps: info tests bench lstm)
set -u
out=${OUT:-results/gpu}
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
python=${PYTHON:-python3}
steps=${*:-info tests bench lstm}

for step in $steps; do
  echo "=== $step"
  case $step in
    info)
      nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
      $python -c 'import sys, numpy, cupy; print(sys.version.split()[0], "numpy", numpy.__version__, "cupy", cupy.__version__)'
      ;;
    tests)
      timeout 220 $python -m pytest -q -p no:cacheprovider \
        tests/test_asyncckpt/execution/test_gpu.py tests/test_asyncckpt/execution/test_device.py \
        2>&1 | tee "$out/tests.log" | tail -40
      ;;
    bench)
      timeout 180 $python benchmarks/bench_gpu.py --device cuda ${BENCH_ARGS:-} \
        2>&1 | tee "$out/bench_gpu.log" | tail -5
      ;;
    lstm)
      timeout 200 $python -m experiments.lstm --device cuda --lengths 100 800 --repeats 3 \
        --out "${LSTM_OUT:-/tmp/asyncckpt-lstm}" 2>&1 | tee "$out/lstm.log" | tail -30
      ;;
    *) echo "unknown step $step" >&2; exit 2 ;;
  esac
done
