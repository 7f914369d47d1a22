#!/usr/bin/env bash
# The checks that need a GPU, as one prepared run on a lent GPU machine (the `device` tool,
# 15 minutes of device time a session): `make device-wheels` here first, then
#   run(command="bash tools/device/check.sh", carry=[".device"], timeout_s=540)
# What it runs, each bounded, each writing under $OUT (what comes back):
#   1. nvidia-smi, and the image's python3, torch and CUDA versions;
#   2. which file systems the driver page-locks the tier's shared slots on (pagelock_probe.py:
#      /dev/shm, /tmp, the checkout's disk), in steps.log;
#   3. `strata worker gpu-check` (the engine on CUDA: greedy decoding through the paged cache
#      equal to recomputation, then prefill, decode and TTFT), gpu-check.json;
#   3b. the engine's logits against transformers' in bfloat16 on CUDA, for every architecture and
#      config layout (tests/worker/fidelity_check.py: the whole context and paged decoding;
#      tolerance: a mean abs error against transformers' float32 logits at most 1.5x
#      transformers' own bfloat16 error, and a max abs diff from its bfloat16 logits at most 0.1x
#      the logits' std), fidelity.json;
#   4. the KV tiers' CUDA path: tests/kvtier/test_engine_integration.py on CUDA
#      (STRATA_TEST_DEVICE=cuda: blocks saved from the GPU's cache to DRAM, NVMe and the shared
#      tier, loaded back into it, and decoding from them equal to recomputation), in steps.log;
#      the GPU's checksums against the host's (tests/kvtier/test_devicehash.py, test_blockcopy.py);
#      and the GPU benchmark's passes, small (tests/bench/test_kvtier_device.py);
#   4b. the GPU's checksums alone by their tunables (hash_probe.py), in steps.log;
#   5. the worker benchmark on the GPU (`python -m bench worker`), worker.json;
#   6. the KV tiers' benchmark on the GPU (`python -m bench kvtier_device`: the DRAM tier's put
#      and get of GPU blocks against the copy engine's own rate, and TTFT cold and from HBM,
#      DRAM and NVMe with the engine on the GPU), kvtier_device.json.
#   7. whether vLLM is there to run Strata's connector on the GPU (python -m bench vllm needs it,
#      and the test control plane's binaries): the image holds no vLLM and its wheels (hundreds
#      of MB) do not fit the 64 MiB a call carries, so this step records the import's error; it
#      does not count as a failure.
# A step that fails is reported and the next one runs; the exit status is the first failure's.
# STRATA_DEVICE_CHECK=cpu runs the same steps on the CPU, to try the script where there is no GPU.
set -uo pipefail
DEVICE=${STRATA_DEVICE_CHECK:-cuda}
OUT=${OUT:-/tmp/strata-device}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
failed=0

# Every step's output goes to one log, $OUT/steps.log: the tool brings back at most 8 files.
step() {  # step NAME TIMEOUT_S COMMAND...: runs it, logs it, remembers a failure
  local name=$1 limit=$2 log=/tmp/strata-device-step.log
  shift 2
  local started=$SECONDS
  timeout "$limit" "$@" >"$log" 2>&1
  local rc=$?
  echo "device-check: $name rc $rc in $((SECONDS - started)) s"
  tail -n 5 "$log"
  { echo "===== $name: rc $rc in $((SECONDS - started)) s"; cat "$log"; } >>"$OUT/steps.log"
  if [ "$rc" -ne 0 ] && [ "$failed" -eq 0 ]; then failed=$rc; fi
}

{ nvidia-smi || true; python3 -c 'import sys, torch; print(sys.version); print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available())'; } >"$OUT/machine.txt" 2>&1
tail -n 3 "$OUT/machine.txt"
if [ -d .device/wheels ]; then
  python3 -m pip install --quiet --no-index --find-links .device/wheels pydantic cryptography >>"$OUT/machine.txt" 2>&1 \
    || echo "device-check: pydantic/cryptography not installed (see machine.txt)"
  python3 -m pip install --quiet --no-index --find-links .device/wheels pytest-asyncio >>"$OUT/machine.txt" 2>&1 \
    || echo "device-check: pytest-asyncio not installed (its tests would not run; these need none)"
else
  echo "device-check: no .device/wheels (make device-wheels here, and carry .device)"
fi
if [ -f .device/include/xxhash.h ]; then  # the KV tiers' copy-and-checksum builds on it
  export C_INCLUDE_PATH=$PWD/.device/include${C_INCLUDE_PATH:+:$C_INCLUDE_PATH}
fi
SIZES=""  # on the GPU, gpu-check's own (the small model, a 4k prompt, a batch of 16)
if [ "$DEVICE" = cpu ]; then SIZES="--preset tiny --prompt-tokens 256 --batch 2 --decode-tokens 4"; fi
if [ "$DEVICE" = cuda ]; then step pagelock 60 python3 tools/device/pagelock_probe.py /dev/shm /tmp "$PWD"; fi
step gpu-check 120 bash -c "python3 -m strata worker gpu-check --device $DEVICE $SIZES >'$OUT/gpu-check.json'"
step fidelity-bf16 150 python3 -m tests.worker.fidelity_check --device "$DEVICE" --dtype bfloat16 \
  --out "$OUT/fidelity.json"
step "kvtier-$DEVICE" 150 env STRATA_TEST_DEVICE="$DEVICE" python3 -m pytest -q -p no:cacheprovider \
  tests/kvtier/test_engine_integration.py tests/kvtier/test_devicehash.py tests/kvtier/test_blockcopy.py \
  tests/bench/test_kvtier_device.py
if [ "$DEVICE" = cuda ]; then step hash-probe 90 python3 tools/device/hash_probe.py; fi
step worker-bench 150 python3 -m bench worker
cp bench/results/worker.json "$OUT/" 2>/dev/null
step kvtier-device-bench 150 python3 -m bench kvtier_device
cp bench/results/kvtier_device.json "$OUT/" 2>/dev/null
saved=$failed
step vllm-import 60 python3 -c 'import vllm; print("vllm", vllm.__version__)'
failed=$saved
exit "$failed"
