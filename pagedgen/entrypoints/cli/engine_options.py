"""The model and engine options of `run` and `profile`, built into an EngineConfig (vLLM's
engine arguments, as flags)."""

import functools

from pagedgen.config import EngineConfig
from pagedgen.entrypoints.cli.options import ENGINE_PANEL, OptionGroup, option
from pagedgen.loader.resolve import DEFAULT_MODEL

_engine = functools.partial(option, ENGINE_PANEL)

ENGINE = OptionGroup(
    "engine",
    EngineConfig,
    {
        "model": (
            str,
            _engine(
                DEFAULT_MODEL,
                "--model",
                "-m",
                help="local Hugging Face folder, hub id in the local cache, or .gguf file",
                metavar="MODEL",
            ),
        ),
        "dtype": (
            str,
            _engine(
                "auto", help="weights and KV cache: auto, float32, bfloat16, float16", metavar="T"
            ),
        ),
        "device": (str, _engine("auto", help="auto, cpu or cuda", metavar="DEVICE")),
        "block_size": (
            int,
            _engine(16, help="tokens per KV-cache block: a power of two up to 128", metavar="N"),
        ),
        "kv_cache_dtype": (
            str,
            _engine(
                "auto",
                help="KV-cache element type: auto (the model's dtype), fp8 (= fp8_e4m3) or "
                "fp8_e5m2, 8-bit floats that hold 2x the tokens of 16-bit ones",
                metavar="T",
            ),
        ),
        "kv_cache_memory": (
            float | None,
            _engine(
                None,
                help="KV-cache pool in GiB [default: 4 on a CPU; on a GPU, see "
                "--gpu-memory-utilization]",
                metavar="GIB",
            ),
        ),
        "max_num_seqs": (int, _engine(256, help="most sequences running at once", metavar="N")),
        "max_num_batched_tokens": (
            int | None,
            _engine(
                None, help="most tokens one step computes [default: the engine's]", metavar="N"
            ),
        ),
        "max_model_len": (
            int | None,
            _engine(None, help="longest prompt + completion [default: the model's]", metavar="N"),
        ),
        "attention_backend": (
            str,
            _engine("auto", help="auto, torch, cpu, cupy (CUDA) or reference", metavar="NAME"),
        ),
        "enable_prefix_caching": (
            bool,
            _engine(
                True,
                "--prefix-caching/--no-prefix-caching",
                help="share the KV blocks of prompts' common prefixes [default: on]",
            ),
        ),
        "enable_chunked_prefill": (
            bool,
            _engine(
                True,
                "--enable-chunked-prefill/--no-enable-chunked-prefill",
                help="split long prompts over steps, beside the running decodes [default: on]",
            ),
        ),
        "preemption_mode": (
            str,
            _engine("auto", help="when the KV cache is full: auto, recompute or swap", metavar="M"),
        ),
        "gpu_memory_utilization": (
            float,
            _engine(
                0.9,
                help="GPU: share of its memory to use; the KV cache gets what the weights and "
                "the largest step leave of it",
                metavar="F",
            ),
        ),
        "swap_space": (
            float,
            _engine(1.0, help="CPU pool for swapped-out KV blocks, in GiB", metavar="GIB"),
        ),
        "num_threads": (
            int | None,
            _engine(None, help="CPU threads [default: torch's choice]", metavar="N"),
        ),
        "trust_remote_code": (
            bool,
            _engine(
                False,
                "--trust-remote-code/--no-trust-remote-code",
                help="run the model folder's own Python for its config or tokenizer (auto_map), "
                "as transformers does with trust_remote_code [default: off]",
            ),
        ),
        "hf_overrides": (
            str | None,
            _engine(
                None,
                help="config fields over the checkpoint's, JSON (vLLM's): {\"architectures\": "
                '["Qwen3ForSequenceClassification"], "classifier_from_token": ["no", "yes"]} '
                "serves a causal LM as a classifier of those tokens' logits (Qwen3-Reranker)",
                metavar="JSON",
            ),
        ),
        "enforce_eager": (
            bool,
            _engine(
                False,
                "--enforce-eager/--no-enforce-eager",
                help="run every step eagerly, without the decode steps' CUDA graphs (GPU) "
                "or CPU graphs (up to 64 rows) [default: graphs]",
            ),
        ),
        "async_scheduling": (
            bool,
            _engine(
                False,
                "--async-scheduling/--no-async-scheduling",
                help="GPU: schedule the next step while the device runs this one [default: off]",
            ),
        ),
        "reasoning_parser": (
            str | None,
            _engine(
                None,
                help="the model reasons first: deepseek_r1, qwen3 or openai_gptoss (vLLM's); chat "
                "answers are split at </think> (gpt-oss: by harmony channel) into reasoning and "
                "content, structured output holds the part after it",
                metavar="NAME",
            ),
        ),
        "generation_config": (
            str,
            _engine(
                "auto",
                help="sampling defaults: auto (the model's generation_config.json, as vLLM), "
                "vllm (SamplingParams' own) or a folder holding a generation_config.json; a "
                "sampling option given here or on an input line wins over them",
                metavar="SRC",
            ),
        ),
        "override_generation_config": (
            str | None,
            _engine(
                None,
                help='fields over the generation config, JSON: {"temperature": 0.5}',
                metavar="JSON",
            ),
        ),
        "speculative_config": (
            str | None,
            _engine(
                None,
                help='speculative decoding by n-gram prompt lookup, vLLM\'s JSON: {"method": '
                '"ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}',
                metavar="JSON",
            ),
        ),
        "runner": (
            str,
            _engine(
                "auto",
                help="generate (completions) or pooling (an embedding, or a classifier's scores, "
                "per prompt); auto: pooling for a checkpoint without an LM head (LlamaModel, "
                "Qwen3Model) or a classifier (LlamaForSequenceClassification)",
                metavar="R",
            ),
        ),
        "pooler_config": (
            str | None,
            _engine(
                None,
                help='how --runner pooling pools, JSON: {"pooling_type": "LAST" | "MEAN" | '
                '"CLS", "use_activation": true (L2-normalize)} [default: the model\'s '
                "sentence-transformers files, else LAST, normalized]",
                metavar="JSON",
            ),
        ),
    },
)
