#!/usr/bin/env bash
# What a lent GPU machine should run first, in one call from the repository root (~10 minutes):
#
#   bash benchmarks/gpu_session.sh [WORKLOAD.json]    # figures and logs land in $OUT
#
# 1. every GPU test (the CUDA kernels, CUDA graphs against eager, the bench's GPU profile);
# 2. pagedgen bench on a random-weight SmolLM2-135M shape in bfloat16: eager with the
#    generate_batch baseline, then decode CUDA graphs (--no-enforce-eager), each with the GPU
#    profile (GPU busy %, kernel launches and graph replays per decode step).
# The workload is a file saved elsewhere with `pagedgen bench --save-workload` (ShareGPT needs
# the dataset package, which GPU machines lack), or else 500 fixed 256-in/128-out prompts.
set -uo pipefail
OUT=${OUT:-/tmp/pagedgen-gpu-session}
mkdir -p "$OUT"
export PYTHONPATH=$PWD
pagedgen() { python -m pagedgen.cli "$@"; }
if [ $# -ge 1 ]; then workload=(--workload "$1"); else
    workload=(--workload fixed --num-prompts 500 --input-len 256 --output-len 128)
fi
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"

timeout 300 python -m pytest -q -m gpu -p no:cacheprovider tests 2>&1 | tail -40 \
    | tee "$OUT/gpu-tests.txt"

model=/tmp/pagedgen-smollm2-shape
[ -d "$model" ] || python benchmarks/random_models.py smollm2-135m "$model" --device cuda \
    --dtype bfloat16 > "$OUT/model.txt" 2>&1
common=(-m "$model" --device cuda --dtype bfloat16 "${workload[@]}" --no-roofline)
timeout 240 pagedgen bench "${common[@]}" --baselines generate_batch --enforce-eager \
    --output-json "$OUT/eager.json" 2>&1 | tail -40 | tee "$OUT/eager.txt"
timeout 180 pagedgen bench "${common[@]}" --baselines '' --no-enforce-eager \
    --output-json "$OUT/graphs.json" 2>&1 | tail -40 | tee "$OUT/graphs.txt"
