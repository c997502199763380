import typer

from pagedgen.loader.resolve import DEFAULT_MODEL

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Offline batch generation with a paged KV cache and continuous batching.",
    pretty_exceptions_enable=False,
)


@app.callback()
def main() -> None:
    """pagedgen: generate completions for a whole file of prompts, as fast as the machine allows."""


@app.command()
def run(
    input: str = typer.Argument(..., help="JSONL of {'prompt'|'messages', 'id'?} ('-' = stdin)"),
    output: str = typer.Option(..., "--output", "-o", help="output JSONL ('-' = stdout)"),
    model: str = typer.Option(DEFAULT_MODEL, "--model", "-m", help="HF folder, hub id or .gguf"),
    dtype: str = typer.Option("auto", help="auto, float32, bfloat16 or float16"),
    device: str = typer.Option("auto", help="auto, cpu or cuda"),
    max_tokens: int = typer.Option(256, help="most tokens to generate per request"),
    min_tokens: int = typer.Option(0),
    temperature: float = typer.Option(1.0, help="0 = greedy"),
    top_p: float = typer.Option(1.0),
    top_k: int = typer.Option(0, help="0 = off"),
    min_p: float = typer.Option(0.0),
    repetition_penalty: float = typer.Option(1.0),
    presence_penalty: float = typer.Option(0.0),
    frequency_penalty: float = typer.Option(0.0),
    seed: int | None = typer.Option(None, help="per-request sampling seed"),
    stop: list[str] | None = typer.Option(None, help="stop string (repeatable)"),
    ignore_eos: bool = typer.Option(False),
    logprobs: int | None = typer.Option(None, help="top log-probabilities per token"),
    block_size: int = typer.Option(16),
    kv_cache_memory: float | None = typer.Option(None, help="KV pool size in GiB"),
    max_num_seqs: int = typer.Option(256),
    max_num_batched_tokens: int | None = typer.Option(None),
    max_model_len: int | None = typer.Option(None),
    attention_backend: str = typer.Option("auto", help="auto, torch, cupy or reference"),
    progress: bool = typer.Option(True, help="show live progress on stderr"),
) -> None:
    """Generate a completion for every line of INPUT and write one JSON line each to OUTPUT."""
    from pagedgen.cli.run import RunOptions, run_batch

    options = RunOptions(
        input=input,
        output=output,
        engine=dict(
            model=model,
            dtype=dtype,
            device=device,
            block_size=block_size,
            kv_cache_memory=kv_cache_memory,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=max_model_len,
            attention_backend=attention_backend,
        ),
        sampling=dict(
            max_tokens=max_tokens,
            min_tokens=min_tokens,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            min_p=min_p,
            repetition_penalty=repetition_penalty,
            presence_penalty=presence_penalty,
            frequency_penalty=frequency_penalty,
            seed=seed,
            stop=stop,
            ignore_eos=ignore_eos,
            logprobs=logprobs,
        ),
        progress=progress,
    )
    raise typer.Exit(run_batch(options))
