import typer

from pagedgen.cli import options as opt


def run(
    input: str = opt.INPUT,
    output: str = typer.Option(..., "--output", "-o", help="output JSONL ('-' = stdout)"),
    resume: bool = typer.Option(
        False, help="keep the records OUTPUT already holds and generate only the missing ones"
    ),
    overwrite: bool = typer.Option(False, help="replace an OUTPUT that already holds records"),
    order: str = typer.Option("input", help="input: in input order; completion: as they finish"),
    stats_json: str | None = typer.Option(None, help="write the run's summary here as JSON"),
    progress: bool = typer.Option(True, help="show live progress on stderr"),
    input_format: str = opt.INPUT_FORMAT,
    split: str = opt.SPLIT,
    prompt_column: str | None = opt.PROMPT_COLUMN,
    messages_column: str | None = opt.MESSAGES_COLUMN,
    id_column: str | None = opt.ID_COLUMN,
    limit: int | None = opt.LIMIT,
    model: str = opt.MODEL,
    dtype: str = opt.DTYPE,
    device: str = opt.DEVICE,
    max_tokens: int = opt.MAX_TOKENS,
    min_tokens: int = typer.Option(0),
    n: int = opt.N,
    temperature: float = opt.TEMPERATURE,
    top_p: float = typer.Option(1.0),
    top_k: int = typer.Option(0, help="0 = off"),
    min_p: float = typer.Option(0.0),
    repetition_penalty: float = typer.Option(1.0),
    presence_penalty: float = typer.Option(0.0),
    frequency_penalty: float = typer.Option(0.0),
    seed: int | None = opt.SEED,
    stop: list[str] | None = typer.Option(None, help="stop string (repeatable)"),
    ignore_eos: bool = typer.Option(False),
    logprobs: int | None = typer.Option(None, help="top log-probabilities per token"),
    block_size: int = opt.BLOCK_SIZE,
    kv_cache_memory: float | None = opt.KV_CACHE_MEMORY,
    max_num_seqs: int = opt.MAX_NUM_SEQS,
    max_num_batched_tokens: int | None = opt.MAX_NUM_BATCHED_TOKENS,
    max_model_len: int | None = opt.MAX_MODEL_LEN,
    attention_backend: str = opt.ATTENTION_BACKEND,
    enable_prefix_caching: bool = opt.PREFIX_CACHING,
    enable_chunked_prefill: bool = opt.CHUNKED_PREFILL,
    preemption_mode: str = opt.PREEMPTION_MODE,
    swap_space: float = opt.SWAP_SPACE,
    num_threads: int | None = opt.NUM_THREADS,
) -> None:
    """Generate a completion for every request of INPUT and write one JSON line each to OUTPUT.

    Input lines are {"prompt" | "messages", "id"?, sampling fields?} or OpenAI batch requests
    (then the output is OpenAI batch responses). A bad line becomes an error record and the run
    goes on. Ctrl-C stops admitting and finishes what started (twice: stops at once); --resume
    continues. Exit codes: 0 all succeeded, 1 some failed, 2 usage error, 130 interrupted.
    """
    from pagedgen.cli.run_job import RunOptions, run_job

    sampling = dict(
        n=n,
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
    )
    engine = opt.engine_args(
        model,
        dtype,
        device,
        block_size,
        kv_cache_memory,
        max_num_seqs,
        max_num_batched_tokens,
        max_model_len,
        attention_backend,
        enable_prefix_caching,
        enable_chunked_prefill,
        preemption_mode,
        swap_space,
        num_threads,
    )
    options = RunOptions(
        input=dict(
            path=input,
            input_format=input_format,
            split=split,
            prompt_column=prompt_column,
            messages_column=messages_column,
            id_column=id_column,
            limit=limit,
        ),
        output=output,
        engine=engine,
        sampling=sampling,
        resume=resume,
        overwrite=overwrite,
        order=order,
        stats_json=stats_json,
        progress=progress,
    )
    raise typer.Exit(run_job(options))
