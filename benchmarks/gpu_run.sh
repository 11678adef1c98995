#!/usr/bin/env bash
# One call on a lent GPU machine (the device tool's run, timeout_s 600): the C kernel built in place
# (the CPU reference of the monitor's kernel check), the CUDA tests that skip on CPU, then
# benchmarks/gpu_check.py (its parts 1, 3 and 2) within GPU_CHECK_BUDGET seconds. Everything lands
# under $OUT: nvidia-smi.txt, build.log, cuda-tests.log, gpu_check.json, simulate.json, gpu_check.log,
# simulate-csv.tar.gz. naig is not installed there: PYTHONPATH=. (the image's python3 has torch, triton,
# numpy, safetensors, typer, rich, pytest). Extra arguments go to gpu_check.py, e.g. for a rerun:
#   GPU_CHECK_BUDGET=200 CUDA_TESTS=tests/test_sketch_triton_sketch.py bash benchmarks/gpu_run.sh --skip-sketch --monitor-models 124m
set -u
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
out=${OUT:-./gpu_out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv >"$out/nvidia-smi.txt" 2>&1
python3 -c "import sys, torch, triton; print(sys.version.split()[0], torch.__version__, triton.__version__)" \
  | tee -a "$out/nvidia-smi.txt"
if ! timeout 90 python3 setup.py -q build_ext --inplace >"$out/build.log" 2>&1; then
  echo "gpu_run: build_ext failed (see build.log): the kernel check compares with the numpy body instead"
fi
if [ -z "${SKIP_TESTS:-}" ]; then
  # shellcheck disable=SC2086 (CUDA_TESTS is a list of test ids)
  timeout "${TESTS_SECONDS:-150}" python3 -m pytest -q -p no:cacheprovider -o addopts="" -rs \
    ${CUDA_TESTS:-tests/test_sketch_triton_sketch.py tests/test_sketch_torch_sketch.py \
    tests/test_sketch_layout_sketch.py \
    tests/test_monitor_observe.py::test_on_cuda_observe_gathers_the_cpu_payload_within_the_float64_bound \
    tests/test_monitor_ddp.py::test_on_cuda_log_mode_is_bit_identical_to_plain_ddp_over_nccl \
    tests/test_simulate_lags_engine.py} >"$out/cuda-tests.log" 2>&1
  tests_rc=$?
  echo "gpu_run: CUDA tests exit $tests_rc ($(tail -n 1 "$out/cuda-tests.log"))"
  grep -E "^(FAILED|ERROR|SKIPPED)" "$out/cuda-tests.log" | head -20
fi
timeout "${CHECK_SECONDS:-420}" python3 benchmarks/gpu_check.py --out "$out" \
  --budget-seconds "${GPU_CHECK_BUDGET:-330}" "$@"
check_rc=$?
echo "gpu_run: gpu_check exit $check_rc"
# the exit status is the first failure's: the tests', else gpu_check's
exit $(( ${tests_rc:-0} != 0 ? ${tests_rc:-0} : check_rc ))
