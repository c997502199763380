import typer

from pagedgen.cli import options as opt


def profile(
    input: str = opt.INPUT,
    simulate: bool = typer.Option(
        False, help="drive the real scheduler with token lengths only, no model"
    ),
    reference_column: str | None = typer.Option(
        None,
        help="field or column with a reference completion (text or token count): the "
        "output length --simulate uses (sharegpt input: the gpt reply)",
    ),
    block_sizes: str = typer.Option(
        "8,16,32,64,128", help="block sizes to compare at the same memory; '' for none"
    ),
    json_output: bool = typer.Option(False, "--json", help="print the report as JSON on stdout"),
    plot: str | None = typer.Option(None, help="save a PNG timeline and block-size comparison"),
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
    n: int = opt.N,
    temperature: float = opt.TEMPERATURE,
    seed: int | None = opt.SEED,
    ignore_eos: bool = typer.Option(False, help="real run: generate max_tokens every time"),
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
    """Report how well the paged KV cache is used for INPUT and a model.

    Bytes per token, the pool's blocks and tokens, and over the run: live-token utilization,
    internal fragmentation, pool usage, preemptions and prefix-sharing savings; beside them,
    contiguous allocation reserving prompt + max_tokens or max_model_len per sequence; and a
    table over block sizes at the same memory. --simulate runs the scheduler without a model.
    """
    from pagedgen.cli.profile_job import ProfileOptions, profile_job

    options = ProfileOptions(
        input=dict(
            path=input,
            input_format=input_format,
            split=split,
            prompt_column=prompt_column,
            messages_column=messages_column,
            id_column=id_column,
            reference_column=reference_column,
            limit=limit,
        ),
        engine=opt.engine_args(
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
        ),
        sampling=dict(
            n=n, max_tokens=max_tokens, temperature=temperature, seed=seed, ignore_eos=ignore_eos
        ),
        simulate=simulate,
        block_sizes=block_sizes,
        json_output=json_output,
        plot=plot,
    )
    raise typer.Exit(profile_job(options))
