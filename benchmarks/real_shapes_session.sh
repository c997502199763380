#!/usr/bin/env bash
# The real-size and quantized-weight figures on this CPU in one go, each run after the other on
# the same workload (the Intel hosts drift ~2x within hours: compare only within one session):
#
#   bash benchmarks/real_shapes_session.sh     (figures and full logs in $OUT)
#
#   llama-1b-sharegpt-bfloat16   the Llama-3.2-1B shape (random weights) on ShareGPT-64 against
#                                vLLM's CPU backend (../shared/tools/vllm-cpu-baseline) in one
#                                invocation
#   llama-1b-sharegpt-float32    the same prompts in float32 (--max-model-len 4096), then
#   llama-1b-vllm-float32        vLLM's run of them apart, with 9 GiB for its K/V
#   llama-8b-bfloat16            the Llama-3-8B shape (random weights), 16 prompts of 100
#   llama-8b-int8, llama-8b-int4 tokens, 32 out, bfloat16 activations, --quantization none,
#                                int8 and int4 in turn; peak RSS from /usr/bin/time -v
#   smollm2-native, smollm2-dense  the default model on ShareGPT-64 in bfloat16 with its Q4_1
#                                integers kept, then dequantized (--quantization none)
#
# SECTIONS picks some of "1b 8b smollm2" (default: all); NUM_PROMPTS (64) and NUM_8B (16) shrink
# the workloads for a smoke run. The random models are built once under $MODELS (the 8B takes 15
# GB of disk and, while it runs, of memory: run it with nothing else on the machine).
set -uo pipefail
OUT=${OUT:-/tmp/pagedgen-real-shapes}
MODELS=${MODELS:-/tmp}
SECTIONS=${SECTIONS:-1b 8b smollm2}
NUM_PROMPTS=${NUM_PROMPTS:-64}
NUM_8B=${NUM_8B:-16}
mkdir -p "$OUT"
here=$(cd "$(dirname "$0")" && pwd)
tool=$(cd "$here/../.." && pwd)/shared/tools/vllm-cpu-baseline
[ -z "${PAGEDGEN_VLLM_BASELINE:-}" ] && [ -f "$tool" ] && export PAGEDGEN_VLLM_BASELINE="bash $tool"
isa=$(grep -o 'avx512[a-z_0-9]*\|amx[a-z_0-9]*' /proc/cpuinfo | sort -u | tr '\n' ' ')
isa="ISA: ${isa:-AVX2 only (no avx512 flag)}"
echo "$isa" | tee "$OUT/isa.txt"
timed=()
[ -x /usr/bin/time ] && timed=(/usr/bin/time -v)
run() {  # run NAME ARGS...: pagedgen bench ARGS (under /usr/bin/time -v), its log under $OUT
    local name=$1; shift
    echo "== $name ($(date +%T))"
    { echo "$isa"; "${timed[@]}" pagedgen bench "$@" --output-json "$OUT/$name.json"; echo "exit $?"; } \
        > "$OUT/$name.txt" 2>&1
    grep -A3 'engine  ' "$OUT/$name.txt" | tail -n 2
    grep -E 'ms / step|Maximum resident|^exit' "$OUT/$name.txt"
}
model() {  # model SHAPE: the folder of benchmarks/random_models.py's SHAPE, built once
    local dir="$MODELS/$1"
    [ -f "$dir/config.json" ] || python "$here/random_models.py" "$1" "$dir" --dtype bfloat16 >&2
    echo "$dir"
}
case " $SECTIONS " in *" 1b "*)
    m=$(model llama-1b)
    # vLLM holds one sequence of the whole 131,072-token context: 4.3 GB of bfloat16 K/V
    (export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-5}
     run llama-1b-sharegpt-bfloat16 -m "$m" --dtype bfloat16 --workload sharegpt \
         --num-prompts "$NUM_PROMPTS" --save-workload "$OUT/sg-1b.json" --baselines vllm \
         --num-threads 2)
    # float32: vLLM after pagedgen, apart, with the 9 GiB of float32 K/V the model's whole
    # context needs (its runner takes no max_model_len); the same workload file
    run llama-1b-sharegpt-float32 -m "$m" --dtype float32 --workload "$OUT/sg-1b.json" \
        --max-model-len 4096 --baselines '' --num-threads 2
    if [ -f "$tool" ]; then
        echo "== llama-1b-vllm-float32 ($(date +%T))"
        VLLM_CPU_KVCACHE_SPACE=9 bash "$tool" --model "$m" --workload "$OUT/sg-1b.json" \
            --dtype float32 --out "$OUT/llama-1b-vllm-float32.json" \
            > "$OUT/llama-1b-vllm-float32.txt" 2>&1
        python -c 'import json, sys; r = json.load(open(sys.argv[1]))
print({k: v for k, v in r.items() if not isinstance(v, list)})' "$OUT/llama-1b-vllm-float32.json"
    fi
esac
case " $SECTIONS " in *" 8b "*)
    m=$(model llama-8b)
    for q in none int8 int4; do
        name=llama-8b-$q; [ "$q" = none ] && name=llama-8b-bfloat16
        run "$name" -m "$m" --dtype bfloat16 --quantization "$q" --workload fixed \
            --num-prompts "$NUM_8B" --input-len 100 --output-len 32 --max-num-seqs "$NUM_8B" \
            --kv-cache-memory 1 --num-threads 2 --baselines '' --no-roofline
    done
esac
case " $SECTIONS " in *" smollm2 "*)
    run smollm2-native --dtype bfloat16 --workload sharegpt --num-prompts "$NUM_PROMPTS" \
        --save-workload "$OUT/sg-smollm2.json" --baselines '' --no-roofline --num-threads 2
    run smollm2-dense --dtype bfloat16 --quantization none --workload "$OUT/sg-smollm2.json" \
        --baselines '' --no-roofline --num-threads 2
esac
