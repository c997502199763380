"""The engine options of `run`, `profile` and `bench`, each defined once and built into an
EngineConfig (vLLM's engine arguments, as flags), in the help's panels as vLLM groups them."""

import functools

import typer

from pagedgen.config import DEFAULT_MODEL, EngineConfig
from pagedgen.entrypoints.cli import options as opt

_model = functools.partial(opt.option, opt.MODEL_PANEL)
_kv_cache = functools.partial(opt.option, opt.KV_CACHE_PANEL)
_scheduler = functools.partial(opt.option, opt.SCHEDULER_PANEL)
_execution = functools.partial(opt.option, opt.EXECUTION_PANEL)
_speculative = functools.partial(opt.option, opt.SPECULATIVE_PANEL)
_pooling = functools.partial(opt.option, opt.POOLING_PANEL)
_structured = opt.structured_option
_sampling = opt.sampling_option

ENGINE = opt.OptionGroup(
    "engine",
    EngineConfig,
    {
        # Model
        "model": (
            str,
            _model(
                DEFAULT_MODEL,
                "--model",
                "-m",
                help="local Hugging Face folder, hub id in the local cache, or .gguf file",
                metavar="MODEL",
            ),
        ),
        "download_dir": (
            str | None,
            _model(
                None,
                help="the Hugging Face cache a hub id is looked up in [default: the usual one]",
                metavar="DIR",
            ),
        ),
        "revision": (
            str | None,
            _model(
                None,
                help="the hub snapshot (branch, tag or commit) to load from the local cache",
                metavar="REV",
            ),
        ),
        "tokenizer": (
            str | None,
            _model(
                None,
                help="a tokenizer folder or hub id apart from the model's [default: the model's]",
                metavar="NAME",
            ),
        ),
        "dtype": (
            str,
            _model(
                "auto",
                help="weights and activations: auto (bfloat16 on a GPU, float32 on a CPU), "
                "float32 (= float), bfloat16 or float16 (= half)",
                metavar="T",
            ),
        ),
        "quantization": (
            str | None,
            _model(
                None,
                help="linear layers' weights: int8 (per row) or int4 (groups of 128) quantizes a "
                "float checkpoint at load, computed at that size on a CPU; none computes in float "
                "[default: the checkpoint's own]",
                metavar="Q",
            ),
        ),
        "max_model_len": (
            int | None,
            _model(None, help="longest prompt + completion [default: the model's]", metavar="N"),
        ),
        "trust_remote_code": (
            bool,
            _model(
                False,
                "--trust-remote-code/--no-trust-remote-code",
                help="run the model folder's own Python for its config or tokenizer (auto_map), "
                "as transformers does with trust_remote_code [default: off]",
            ),
        ),
        "hf_overrides": (
            str | None,
            _model(
                None,
                help="config fields over the checkpoint's, JSON (vLLM's): {\"architectures\": "
                '["Qwen3ForSequenceClassification"], "classifier_from_token": ["no", "yes"]} '
                "serves a causal LM as a classifier of those tokens' logits (Qwen3-Reranker)",
                metavar="JSON",
            ),
        ),
        # KV cache
        "block_size": (
            int,
            _kv_cache(16, help="tokens per KV-cache block: a power of two up to 128", metavar="N"),
        ),
        "kv_cache_dtype": (
            str,
            _kv_cache(
                "auto",
                help="KV-cache element type: auto (the model's dtype), fp8 (= fp8_e4m3) or "
                "fp8_e5m2, 8-bit floats that hold 2x the tokens of 16-bit ones",
                metavar="T",
            ),
        ),
        "kv_cache_memory": (
            float | None,
            _kv_cache(
                None,
                help="KV-cache pool in GiB [default: 4 on a CPU; on a GPU, see "
                "--gpu-memory-utilization]",
                metavar="GIB",
            ),
        ),
        "gpu_memory_utilization": (
            float,
            _kv_cache(
                0.9,
                help="GPU: share of its memory to use; the KV cache gets what the weights and "
                "the largest step leave of it (on a CPU, ignored, as vLLM's CPU backend does)",
                metavar="F",
            ),
        ),
        "swap_space": (
            float,
            _kv_cache(1.0, help="CPU pool for swapped-out KV blocks, in GiB", metavar="GIB"),
        ),
        "enable_prefix_caching": (
            bool,
            _kv_cache(
                True,
                "--enable-prefix-caching/--no-enable-prefix-caching",
                help="share the KV blocks of prompts' common prefixes [default: on]",
            ),
        ),
        # Scheduler
        "max_num_seqs": (
            int,
            _scheduler(256, help="most sequences running at once", metavar="N"),
        ),
        "max_num_batched_tokens": (
            int | None,
            _scheduler(
                None, help="most tokens one step computes [default: the engine's]", metavar="N"
            ),
        ),
        "enable_chunked_prefill": (
            bool,
            _scheduler(
                True,
                "--enable-chunked-prefill/--no-enable-chunked-prefill",
                help="split long prompts over steps, beside the running decodes [default: on]",
            ),
        ),
        "preemption_mode": (
            str,
            _scheduler(
                "auto", help="when the KV cache is full: auto, recompute or swap", metavar="M"
            ),
        ),
        "async_scheduling": (
            bool,
            _scheduler(
                False,
                "--async-scheduling/--no-async-scheduling",
                help="schedule the next step while the device runs this one (GPU or CPU) "
                "[default: off]",
            ),
        ),
        # Execution
        "device": (str, _execution("auto", help="auto, cpu or cuda", metavar="DEVICE")),
        "tensor_parallel_size": (
            int,
            _execution(
                1,
                "--tensor-parallel-size",
                "-tp",
                help="vLLM's; 1 only: one process runs on one device (--ray or --shard spread "
                "a batch over processes)",
                metavar="N",
            ),
        ),
        "pipeline_parallel_size": (
            int,
            _execution(
                1,
                "--pipeline-parallel-size",
                "-pp",
                help="vLLM's; 1 only, as --tensor-parallel-size",
                metavar="N",
            ),
        ),
        "num_threads": (
            int | None,
            _execution(
                None,
                help="CPU threads [default: one a core, less those other processes keep busy]",
                metavar="N",
            ),
        ),
        "attention_backend": (
            str,
            _execution("auto", help="auto, torch, cpu, cupy (CUDA) or reference", metavar="NAME"),
        ),
        "enforce_eager": (
            bool,
            _execution(
                False,
                "--enforce-eager/--no-enforce-eager",
                help="run every step eagerly, without graphs [default: graphs, as "
                "--compilation-config says]",
            ),
        ),
        "compilation_config": (
            str | None,
            _execution(
                None,
                help='which steps replay graphs, JSON (vLLM\'s names): {"cudagraph_mode": '
                '"FULL_DECODE_ONLY" | "FULL_AND_PIECEWISE", "max_cudagraph_capture_size": 512}; '
                "decode steps from whole-step graphs (CUDA graphs, or CPU graphs of up to 64 "
                "rows), and with FULL_AND_PIECEWISE steps with prefill rows from piecewise "
                "graphs [default: FULL_AND_PIECEWISE on a GPU, FULL_DECODE_ONLY on a CPU]",
                metavar="JSON",
            ),
        ),
        "cuda_attention_config": (
            str | None,
            _execution(
                None,
                help='which CUDA attention kernels the cupy backend takes, JSON: {"prefill_kernel"'
                ': true, "grouped_decode", "l2_prefetch", "tensor_core_decode", '
                '"tensor_core_prefill": true | false | null (null: by shape), '
                '"decode_longest_first": false}',
                metavar="JSON",
            ),
        ),
        # Speculative decoding
        "speculative_config": (
            str | None,
            _speculative(
                None,
                help='speculative decoding by n-gram prompt lookup, vLLM\'s JSON: {"method": '
                '"ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}',
                metavar="JSON",
            ),
        ),
        # Pooling
        "runner": (
            str,
            _pooling(
                "auto",
                help="generate (completions) or pooling (an embedding, or a classifier's scores, "
                "per prompt); auto: pooling for a checkpoint without an LM head (LlamaModel, "
                "Qwen3Model) or a classifier (LlamaForSequenceClassification)",
                metavar="R",
            ),
        ),
        "pooler_config": (
            str | None,
            _pooling(
                None,
                help='how --runner pooling pools, JSON: {"pooling_type": "LAST" | "MEAN" | '
                '"CLS", "use_activation": true (L2-normalize)} [default: the model\'s '
                "sentence-transformers files, else LAST, normalized]",
                metavar="JSON",
            ),
        ),
        # Structured output and reasoning
        "reasoning_parser": (
            str | None,
            _structured(
                None,
                help="the model reasons first: deepseek_r1, qwen3 or openai_gptoss (vLLM's); chat "
                "answers are split at </think> (gpt-oss: by harmony channel) into reasoning and "
                "content, structured output holds the part after it",
                metavar="NAME",
            ),
        ),
        # Sampling defaults
        "generation_config": (
            str,
            _sampling(
                "auto",
                help="sampling defaults: auto (the model's generation_config.json, as vLLM), "
                "vllm (SamplingParams' own) or a folder holding a generation_config.json; a "
                "sampling option given here or on an input line wins over them",
                metavar="SRC",
            ),
        ),
        "override_generation_config": (
            str | None,
            _sampling(
                None,
                help='fields over the generation config, JSON: {"temperature": 0.5}',
                metavar="JSON",
            ),
        ),
    },
    aliases={
        "prefix_caching": (
            "enable_prefix_caching",
            bool | None,
            typer.Option(
                None,
                "--prefix-caching/--no-prefix-caching",
                hidden=True,
                help="the older name of --enable-prefix-caching",
            ),
        ),
    },
)
