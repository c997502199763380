#!/usr/bin/env bash
# What a lent GPU machine runs, from the repository root, in calls of under ten minutes:
#
#   STAGES="tests smollm2-graphs" bash benchmarks/gpu_session.sh [WORKLOAD.json] [TOKENIZER_DIR]
#
# Stages (figures and full logs land in $OUT):
#   tests-xdist      the GPU tests of the attention kernels (mma among them), CUDA and piecewise
#                    graphs, test_gpu.py and the engine's other GPU tests (pieces are on there by
#                    default now), eight processes at a time (~2 min on an H200)
#   tests            every GPU test (the CUDA kernels, CUDA graphs against eager, the GPU profile):
#                    ~13 min on a fresh H100 (NVRTC compiles every module first), over one call's
#                    limit, so a session runs its halves, tests-a (test_gpu.py, test_gpu_fp8.py:
#                    455 tests, ~8 min) and tests-b (the other ~540, test_gpu_mma.py's 59 among them,
#                    ~6 min), in two calls
#   mma-smoke        the tensor-core kernels' GPU tests that tell first whether PTX agrees with
#                    the emulator (kernels/mma.cuh's probes, then prefill and decode; ~2 min)
#   ncu              Nsight Compute on each attention kernel (benchmarks/ncu_attention.py: decode
#                    at three shapes, prefill at one): DRAM throughput, occupancy and warp stall
#                    reasons, the why of a GB/s figure; NCU_KERNELS (a regex, "attention" by
#                    default) picks the kernels, "mma" the tensor-core ones
#   decode-kernels   benchmarks/bench_kernels.py alone (~4 min)
#   kernels          benchmarks/bench_kernels.py: the kernels' GB/s against the device's peak,
#                    decode per-head, grouped (each without and with prefetch) and mma (~4 min);
#                    then benchmarks/bench_prefill.py: prefill TFLOP/s, CUDA cores and tensor cores
#   sweep            benchmarks/sweep_decode.py: the decode kernels' compile-time knobs and the mma
#                    kernel's v1/v2 partition sizes on the same shapes (~5 min), every variant in
#                    $OUT/sweep.json
#   sweep-mma        the mma kernel alone: its plans (v1, v2 at each partition size), stages and
#                    register budgets on every shape,
#                    the uneven ShareGPT batch among them ($OUT/sweep-mma.json)
#   smollm2-eager    pagedgen bench on a random-weight SmolLM2-135M shape, bfloat16, eager,
#                    with the baselines in $BASELINES (default generate_batch)
#   smollm2-graphs   the same with decode CUDA graphs (--no-enforce-eager)
#   smollm2-async    graphs and async scheduling (--async-scheduling)
#   smollm2-grouped  graphs, async scheduling and the GQA-grouped decode kernel
#                    (--cuda-attention-config grouped_decode true; the other stages set it false,
#                    the per-head kernel, where the default would pick by shape)
#   smollm2-prefetch graphs and async scheduling, decode warps prefetching their next KV block
#                    into L2 (l2_prefetch true)
#   smollm2-grouped-prefetch   both
#   smollm2-mma      graphs, async scheduling and the tensor-core attention kernels on every
#                    layer (tensor_core_decode and tensor_core_prefill true,
#                    kernels/paged_attention_mma.cu and prefill_attention_mma.cu; the other stages
#                    set them false, auto leaves them null: decode on tensor cores for GQA groups
#                    of 3 or more, prefill for every 16-bit layer)
#   smollm2-auto     graphs and async scheduling, each kernel and prefetch as pagedgen picks them
#                    by shape, and steps with prefill rows from piecewise CUDA graphs (no
#                    config given): what a user gets
#   smollm2-piecewise  auto with --compilation-config cudagraph_mode FULL_AND_PIECEWISE said
#                    (worker/piecewise_graphs.py; the stages but auto and lpt say FULL_DECODE_ONLY)
#   smollm2-piecewise4k  the same with pieces for steps of up to 4,096 tokens, the whole token
#                    budget (max_cudagraph_capture_size 4096; 512 by default): on an H200 the
#                    steps past 512 tokens were ~20 % of SmolLM2's mixed steps, each ~30 ms eager
#   smollm2-lpt      auto with the tensor-core v1 decode kernel taking each step's sequences
#                    longest first (decode_longest_first true; off by default)
#   piecewise-smoke  the piecewise graphs' GPU test (outputs equal to eager; ~1 min)
#   llama8b-eager, llama8b-graphs, llama8b-async, llama8b-grouped, llama8b-prefetch,
#   llama8b-grouped-prefetch, llama8b-mma, llama8b-auto, llama8b-piecewise,
#   llama8b-piecewise4k, llama8b-lpt   the same on a
#                    random-weight Llama-3-8B
#                    shape
#   deepseek-eager   the same on a random-weight DeepSeek-V2-Lite (MLA's latent cache through the
#                    torch backend, 64 experts: eager, as every mixture runs)
#   host-profile     benchmarks/host_profile.py on the SmolLM2 shape: cProfile of the steps no
#                    decode graph serves, and each kind of launch's host cost (~1 min)
# The baselines run in the first bench stage of each shape only (BASELINES_EVERY=1: in every
# one): generate_batch takes ~80 s on the 8B shape, and it is the same in each. Every stage gives
# pagedgen the same KV pool, KV_CACHE_GIB (24: room for 256 sequences of 639 tokens of the 8B
# shape), so that stages with and without baselines compare.
# A call lasts at most 600 s, and a session now has 15 minutes of device time in all (a machine
# start takes 1-2 of them), so the first call carries what issue 15 still lacks, most decisive
# first, and the second whatever time is left, at once: a machine given back between calls may
# not be lent again that session (stop 44's was not).
# On an H200 the stages ran far faster than these estimates, made on an H100 with the
# baselines: mma-smoke 21 s, decode-kernels 58 s, llama8b-* ~60 s (~135 s with generate_batch),
# smollm2-* ~40 s (~105 s with it), host-profile ~70 s, tests-xdist (579 tests, eight at a time)
# 100 s; a machine's start ~30 s. Stop 44 ran tests-xdist smollm2-auto llama8b-auto with
# generate_batch (344 s), so next:
#   call 1: BASELINES='' STAGES="tests-xdist decode-kernels sweep-mma llama8b-piecewise4k"
#           (~7 min, what the open targets need if no second call comes: the GPU tests first, stop
#           44's mma combine and longest-first graphs among them; bench_kernels' figures with that
#           combine; the mma kernel's plans, stages and longest-first order on every shape; the
#           8B's decode step against the bytes bound, pieces over the whole token budget)
#   call 2, straight after: BASELINES='' NCU_KERNELS=mma STAGES="llama8b-lpt ncu smollm2-piecewise4k"
#           (the 8B's decode steps with the longest sequences first against call 1's, why the mma
#           kernel falls short on the small and uneven shapes), or what call 1 points at
# Others: "sweep" (~5 min), "tests-a" / "tests-b" (all GPU tests, one at a time, ~8 / ~6 min),
# "kernels" (decode and prefill kernels), the eager/graphs/grouped/mma stages of each shape.
# The workload is a file saved elsewhere (ShareGPT needs the dataset package, which GPU machines
# lack), or else 500 fixed 256-in/128-out prompts. GPU machines hold no Hugging Face cache: the
# random models take their tokenizer from TOKENIZER_DIR. `python benchmarks/gpu_inputs.py` makes
# both here in seconds, in .gpuwl/ (ShareGPT-1000 and the default model's tokenizer, 4 MB), so a
# call is: carry [".gpuwl"], command
#   STAGES="..." bash benchmarks/gpu_session.sh .gpuwl/sharegpt-1000.json .gpuwl/tokenizer
set -uo pipefail
OUT=${OUT:-/tmp/pagedgen-gpu-session}
STAGES=${STAGES:-tests-xdist decode-kernels sweep-mma llama8b-piecewise4k}  # call 1 above
BASELINES=${BASELINES-generate_batch}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
if [ -n "${1:-}" ]; then workload=(--workload "$1"); else
    workload=(--workload fixed --num-prompts 500 --input-len 256 --output-len 128)
fi
tokenizer=(); [ -n "${2:-}" ] && tokenizer=(--tokenizer "$2")
gpu_tests=(-q -m gpu -p no:cacheprovider --continue-on-collection-errors --durations=15)
tests_a=(tests/kernels/gpu/test_cupy_backend.py tests/kernels/gpu/test_fp8.py)
baselines_ran=''
run() {  # run NAME TIMEOUT CMD...: the whole log under $OUT, its end on stdout
    local name=$1 limit=$2; shift 2
    echo "== $name ($(date +%T))"
    timeout "$limit" "$@" > "$OUT/$name.txt" 2>&1
    echo "exit $?" >> "$OUT/$name.txt"
    tail -n "${TAIL:-30}" "$OUT/$name.txt"
}
random_model() {  # random_model PRESET: its folder, made once a machine
    local model=/tmp/pagedgen-$1
    [ -d "$model" ] || python benchmarks/random_models.py "$1" "$model" --device cuda \
        --dtype bfloat16 "${tokenizer[@]}" > "$OUT/model-$1.txt" 2>&1
    echo "$model"
}
bench() {  # bench PRESET MODE TIMEOUT: MODE eager, graphs, async, grouped, prefetch,
    # grouped-prefetch, mma, auto, lpt, piecewise or piecewise4k
    local preset=$1 mode=$2 model
    model=$(random_model "$preset")
    local flags=(--enforce-eager)
    [ "$mode" = graphs ] && flags=(--no-enforce-eager)
    [ "$mode" != eager ] && [ "$mode" != graphs ] && flags=(--no-enforce-eager --async-scheduling)
    local grouped=false prefetch=false mma=false
    [[ $mode == grouped* ]] && grouped=true
    [[ $mode == *prefetch ]] && prefetch=true
    [ "$mode" = mma ] && mma=true
    [ "$mode" = auto ] || [ "$mode" = lpt ] || [[ $mode == piecewise* ]] && grouped=null \
        prefetch=null mma=null  # null: the shape decides
    local longest_first=false
    [ "$mode" = lpt ] && longest_first=true
    local cudagraph_mode='"FULL_DECODE_ONLY"' max_tokens=512
    [[ $mode == piecewise* ]] && cudagraph_mode='"FULL_AND_PIECEWISE"'
    [ "$mode" = auto ] || [ "$mode" = lpt ] && cudagraph_mode=null  # null: on, on a GPU
    [ "$mode" = piecewise4k ] && max_tokens=4096
    local attention="{\"grouped_decode\": $grouped, \"l2_prefetch\": $prefetch,"
    attention+=" \"tensor_core_decode\": $mma, \"tensor_core_prefill\": $mma,"
    attention+=" \"decode_longest_first\": $longest_first}"
    local compilation="{\"cudagraph_mode\": $cudagraph_mode,"
    compilation+=" \"max_cudagraph_capture_size\": $max_tokens}"
    local baselines=$BASELINES
    [[ " $baselines_ran " == *" $preset "* ]] && [ "${BASELINES_EVERY:-0}" != 1 ] && baselines=''
    baselines_ran+=" $preset"
    run "$preset-$mode" "$3" python -m pagedgen.entrypoints.cli bench -m "$model" --device cuda \
        --dtype bfloat16 "${workload[@]}" --no-roofline --baselines "$baselines" "${flags[@]}" \
        --cuda-attention-config "$attention" --compilation-config "$compilation" \
        --kv-cache-memory "${KV_CACHE_GIB:-24}" \
        --output-json "$OUT/$preset-$mode.json"
}
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
for stage in $STAGES; do case $stage in
    tests) TAIL=40 run gpu-tests 580 python -m pytest "${gpu_tests[@]}" tests ;;
    tests-a) TAIL=40 run gpu-tests-a 560 python -m pytest "${gpu_tests[@]}" "${tests_a[@]}" ;;
    tests-b) TAIL=40 run gpu-tests-b 560 python -m pytest "${gpu_tests[@]}" tests \
        "${tests_a[@]/#/--ignore=}" ;;
    tests-xdist) TAIL=40 run gpu-tests-xdist 300 python -m pytest "${gpu_tests[@]}" -n 8 \
        --timeout=180 tests/kernels/gpu/test_mma_attention.py tests/kernels/gpu/test_prefill_mma.py \
        tests/kernels/test_mma_primitives.py tests/kernels/gpu/test_grouped_attention.py \
        tests/worker/graphs/test_cuda_graphs.py tests/kernels/gpu/test_prefill_attention.py tests/kernels/gpu/test_cupy_backend.py \
        tests/worker/test_spec_decode.py tests/worker/test_prompt_logprobs.py tests/worker/pooler/test_embed.py \
        tests/entrypoints/bench/test_profile_steps.py tests/worker/lora/test_merged_weights.py tests/kernels/gpu/test_layer_ops.py ;;
    mma-smoke) TAIL=15 run mma-smoke 300 python -m pytest "${gpu_tests[@]}" \
        tests/kernels/test_mma_primitives.py tests/kernels/gpu/test_prefill_mma.py::test_prefill_mma_gqa \
        tests/kernels/gpu/test_mma_attention.py::test_mma_long_contexts \
        tests/kernels/gpu/test_mma_attention.py::test_backend_decodes_with_the_mma_kernel ;;
    ncu) TAIL=80 run ncu 300 ncu --nvtx --kernel-name "regex:${NCU_KERNELS:-attention}" \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
        --section WarpStateStats --section LaunchStats \
        python benchmarks/ncu_attention.py --dtype bfloat16 ;;
    decode-kernels) run kernels 300 python benchmarks/bench_kernels.py --dtype bfloat16 ;;
    kernels) run kernels 300 python benchmarks/bench_kernels.py --dtype bfloat16
        run prefill-kernels 120 python benchmarks/bench_prefill.py --dtype bfloat16 ;;
    sweep) TAIL=20 run sweep 500 python benchmarks/sweep_decode.py --dtype bfloat16 \
        --output-json "$OUT/sweep.json" ;;
    sweep-mma) TAIL=60 run sweep-mma 300 python benchmarks/sweep_decode.py --dtype bfloat16 \
        --kinds mma --output-json "$OUT/sweep-mma.json" ;;
    smollm2-eager) bench smollm2-135m eager 200 ;;
    smollm2-graphs) bench smollm2-135m graphs 200 ;;
    smollm2-async) bench smollm2-135m async 200 ;;
    smollm2-grouped) bench smollm2-135m grouped 200 ;;
    smollm2-prefetch) bench smollm2-135m prefetch 200 ;;
    smollm2-grouped-prefetch) bench smollm2-135m grouped-prefetch 200 ;;
    smollm2-mma) bench smollm2-135m mma 200 ;;
    smollm2-auto) bench smollm2-135m auto 200 ;;
    smollm2-piecewise) bench smollm2-135m piecewise 200 ;;
    smollm2-piecewise4k) bench smollm2-135m piecewise4k 200 ;;
    smollm2-lpt) bench smollm2-135m lpt 200 ;;
    llama8b-eager) bench llama-8b eager 300 ;;
    llama8b-graphs) bench llama-8b graphs 300 ;;
    llama8b-async) bench llama-8b async 300 ;;
    llama8b-grouped) bench llama-8b grouped 300 ;;
    llama8b-prefetch) bench llama-8b prefetch 300 ;;
    llama8b-grouped-prefetch) bench llama-8b grouped-prefetch 300 ;;
    llama8b-mma) bench llama-8b mma 300 ;;
    llama8b-auto) bench llama-8b auto 300 ;;
    llama8b-piecewise) bench llama-8b piecewise 300 ;;
    llama8b-piecewise4k) bench llama-8b piecewise4k 300 ;;
    llama8b-lpt) bench llama-8b lpt 300 ;;
    piecewise-smoke) TAIL=15 run piecewise-smoke 200 python -m pytest "${gpu_tests[@]}" \
        tests/worker/graphs/test_cuda_graphs.py -k piecewise ;;
    deepseek-eager) bench deepseek-v2-lite eager 400 ;;
    host-profile) TAIL=120 run host-profile 200 python benchmarks/host_profile.py \
        "$(random_model smollm2-135m)" "${1:?host-profile needs a workload file}" ;;
    *) echo "unknown stage $stage" ;;
esac; done
