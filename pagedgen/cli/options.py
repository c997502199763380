"""Options that `run` and `profile` share: the model and engine, the input, and sampling."""

from typing import Any

import typer

from pagedgen.loader.resolve import DEFAULT_MODEL

INPUT = typer.Argument(
    ...,
    help="JSONL (pagedgen or OpenAI batch), text (--input-format text), '-' for stdin, a dataset "
    "(save_to_disk folder, parquet/csv/json file, hub id in the local cache), or 'sharegpt'",
)
INPUT_FORMAT = typer.Option(
    "auto", help="auto, jsonl, openai, text, dataset or sharegpt (auto: from the path)"
)
SPLIT = typer.Option("train", help="dataset split")
PROMPT_COLUMN = typer.Option(None, help="dataset column holding the prompt")
MESSAGES_COLUMN = typer.Option(None, help="dataset column holding chat messages")
ID_COLUMN = typer.Option(None, help="dataset column holding the request id")
LIMIT = typer.Option(None, help="read at most this many input records")

MODEL = typer.Option(DEFAULT_MODEL, "--model", "-m", help="HF folder, hub id or .gguf")
DTYPE = typer.Option("auto", help="auto, float32, bfloat16 or float16")
DEVICE = typer.Option("auto", help="auto, cpu or cuda")
BLOCK_SIZE = typer.Option(16, help="tokens per KV-cache block: 8, 16, 32, 64 or 128")
KV_CACHE_MEMORY = typer.Option(None, help="KV pool size in GiB")
MAX_NUM_SEQS = typer.Option(256)
MAX_NUM_BATCHED_TOKENS = typer.Option(None)
MAX_MODEL_LEN = typer.Option(None)
ATTENTION_BACKEND = typer.Option("auto", help="auto, torch, cpu, cupy or reference")
PREFIX_CACHING = typer.Option(
    True,
    "--enable-prefix-caching/--no-enable-prefix-caching",
    "--prefix-caching/--no-prefix-caching",
)
CHUNKED_PREFILL = typer.Option(True, "--enable-chunked-prefill/--no-enable-chunked-prefill")
PREEMPTION_MODE = typer.Option("auto", help="auto, recompute or swap")
SWAP_SPACE = typer.Option(1.0, help="CPU swap pool in GiB")
NUM_THREADS = typer.Option(None, help="CPU threads for torch (default: torch's choice)")

MAX_TOKENS = typer.Option(256, help="most tokens to generate per request")
TEMPERATURE = typer.Option(1.0, help="0 = greedy")
N = typer.Option(1, "--n", "-n", help="completions per prompt")
SEED = typer.Option(None, help="per-request sampling seed")


def engine_args(
    model: str,
    dtype: str,
    device: str,
    block_size: int,
    kv_cache_memory: float | None,
    max_num_seqs: int,
    max_num_batched_tokens: int | None,
    max_model_len: int | None,
    attention_backend: str,
    enable_prefix_caching: bool,
    enable_chunked_prefill: bool,
    preemption_mode: str,
    swap_space: float,
    num_threads: int | None,
) -> dict[str, Any]:
    return dict(
        model=model,
        dtype=dtype,
        device=device,
        block_size=block_size,
        kv_cache_memory=kv_cache_memory,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_model_len,
        attention_backend=attention_backend,
        enable_prefix_caching=enable_prefix_caching,
        enable_chunked_prefill=enable_chunked_prefill,
        preemption_mode=preemption_mode,
        swap_space=swap_space,
        num_threads=num_threads,
    )
