import typer

from pagedgen.config import EngineConfig
from pagedgen.entrypoints.cli import chat_options as chat_opt
from pagedgen.entrypoints.cli import options as opt
from pagedgen.entrypoints.cli.engine_options import ENGINE
from pagedgen.entrypoints.cli.ray_options import RAY, RayOptions
from pagedgen.entrypoints.io.spec import InputSpec

_output = opt.output_option


def _source(ctx: typer.Context, name: str) -> str | None:
    """Where the option's value came from: "DEFAULT" where the command line left it."""
    source = ctx.get_parameter_source(name)
    return None if source is None else source.name


def _sampling(default: object, help: str, metavar: str) -> object:
    return opt.sampling_option(default, help=help, metavar=metavar)


@opt.with_options(opt.INPUT, ENGINE, RAY)
def run(
    ctx: typer.Context,
    spec: InputSpec,
    engine: EngineConfig,
    scale: RayOptions,
    output: str = _output(
        ..., "--output", "-o", help="the output JSONL ('-' = stdout)", metavar="FILE"
    ),
    resume: bool = _output(
        False, "--resume", help="keep the records OUTPUT holds and generate only the missing ones"
    ),
    overwrite: bool = _output(False, "--overwrite", help="replace an OUTPUT that holds records"),
    order: str = _output(
        "input", help="input: records in input order; completion: as they finish", metavar="O"
    ),
    stats_json: str | None = _output(
        None, help="also write the final summary here, as JSON ('-' = stdout)", metavar="FILE"
    ),
    progress: bool = _output(
        True,
        "--progress/--no-progress",
        help="live progress on stderr, a line every 5 s off a terminal [default: on]",
    ),
    max_tokens: int = opt.MAX_TOKENS,
    min_tokens: int = _sampling(0, "generate at least N tokens before any stop", "N"),
    n: int = opt.N,
    temperature: float = opt.TEMPERATURE,
    top_p: float = _sampling(1.0, "sample from the likeliest tokens that reach P (1 = off)", "P"),
    top_k: int = _sampling(0, "sample from the K likeliest tokens (0 = off)", "K"),
    min_p: float = _sampling(0.0, "drop tokens under P x the likeliest one's chance", "P"),
    repetition_penalty: float = _sampling(1.0, "> 1 discourages tokens already seen", "X"),
    presence_penalty: float = _sampling(0.0, "-2..2: penalize tokens already generated", "X"),
    frequency_penalty: float = _sampling(0.0, "-2..2: penalize tokens by their count", "X"),
    seed: int | None = opt.SEED,
    stop: list[str] | None = _sampling(None, "stop at this string (repeatable)", "TEXT"),
    ignore_eos: bool = opt.IGNORE_EOS,
    logprobs: int | None = _sampling(None, "record each token's K likeliest log-probs", "K"),
    prompt_logprobs: int | None = _sampling(
        None, "record each prompt token's log-prob and the K likeliest", "K"
    ),
    json_schema: str | None = opt.structured_option(
        None, help="every completion is JSON valid under this schema (a file)", metavar="FILE"
    ),
    regex: str | None = opt.structured_option(
        None, help="every completion matches this regular expression", metavar="RE"
    ),
    choice: str | None = opt.structured_option(
        None, help="every completion is one of these comma-separated strings", metavar="A,B,.."
    ),
    lora_modules: list[str] | None = opt.lora_option(
        None,
        help='a LoRA adapter (PEFT folder) input lines name in "lora" (OpenAI batch: in '
        '"model"); repeatable',
        metavar="NAME=PATH",
    ),
    max_loras: int | None = opt.lora_option(
        None, help="adapters one step may run [default: as many as --lora-modules]", metavar="N"
    ),
    max_lora_rank: int | None = opt.lora_option(
        None, help="largest adapter rank [default: the adapters' largest]", metavar="R"
    ),
    max_cpu_loras: int | None = opt.lora_option(
        None, help="adapters kept read in memory [default: --max-loras]", metavar="N"
    ),
    chat_template: str | None = chat_opt.CHAT_TEMPLATE,
    default_chat_template_kwargs: str | None = chat_opt.DEFAULT_CHAT_TEMPLATE_KWARGS,
    apply_chat_template: bool = chat_opt.APPLY_CHAT_TEMPLATE,
    tool_call_parser: str | None = chat_opt.TOOL_CALL_PARSER,
) -> None:
    """Generate a completion for every request of INPUT and write one JSON line each to OUTPUT.

    Input lines are {"prompt" | "messages", "id"?, sampling fields?} or OpenAI batch requests
    (then the output is OpenAI batch responses). A bad line becomes an error record and the run
    goes on. Ctrl-C, SIGTERM or SIGHUP stops admitting and finishes what started (a second:
    stops at once); --resume continues. Exit codes: 0 all succeeded, 1 some failed, 2 usage
    error, 74 the output could not be written, 130/143/129 interrupted by SIGINT/TERM/HUP, 141
    the reader of '-o -' closed the pipe.
    """
    from pagedgen.entrypoints.cli.run_job import RunOptions, lora_engine, run_job
    from pagedgen.entrypoints.cli.structured import structured_outputs_option

    try:
        structured_outputs = structured_outputs_option(json_schema, regex, choice)
        template = chat_opt.chat_template(
            chat_template, default_chat_template_kwargs, apply_chat_template
        )
        chat_opt.check_tool_call_parser(tool_call_parser)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from e

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
        prompt_logprobs=prompt_logprobs,
        structured_outputs=structured_outputs,
    )
    try:
        limits = dict(max_loras=max_loras, max_lora_rank=max_lora_rank, max_cpu_loras=max_cpu_loras)
        engine, loras = lora_engine(engine, lora_modules or [], **limits)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from e
    given = {name for name in sampling if _source(ctx, name) != "DEFAULT"}
    options = RunOptions(
        input=spec,
        output=output,
        engine=engine,
        sampling=sampling,
        sampling_given=frozenset(given),
        chat_template=template,
        tool_call_parser=tool_call_parser,
        resume=resume,
        overwrite=overwrite,
        order=order,
        stats_json=stats_json,
        progress=progress,
        argv=list(ctx.obj or []),
        loras=loras,
    )
    if scale.enabled:
        from pagedgen.entrypoints.cli.run_ray import run_ray_job

        raise typer.Exit(run_ray_job(options, scale))
    raise typer.Exit(run_job(options))
