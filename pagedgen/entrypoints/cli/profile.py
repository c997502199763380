from dataclasses import replace

import typer

from pagedgen.config import EngineConfig
from pagedgen.entrypoints.cli import chat_options as chat_opt
from pagedgen.entrypoints.cli import options as opt
from pagedgen.entrypoints.cli.engine_options import ENGINE
from pagedgen.entrypoints.io.spec import InputSpec

REPORT_PANEL = "Report"


@opt.with_options(opt.INPUT, ENGINE)
def profile(
    ctx: typer.Context,
    spec: InputSpec,
    engine: EngineConfig,
    simulate: bool = opt.option(
        REPORT_PANEL,
        False,
        "--simulate",
        help="drive the real scheduler with token lengths only, no model",
    ),
    reference_column: str | None = opt.input_option(
        None,
        help="field or column with a reference completion (text or token count): the output "
        "length --simulate uses (sharegpt input: the gpt reply)",
        metavar="COL",
    ),
    block_sizes: str = opt.option(
        REPORT_PANEL,
        "8,16,32,64,128",
        help="block sizes to compare at the same memory; '' for none",
        metavar="LIST",
    ),
    json_output: bool = opt.option(
        REPORT_PANEL, False, "--json", help="print the report as JSON on stdout"
    ),
    plot: str | None = opt.option(
        REPORT_PANEL, None, help="save a PNG timeline and block-size comparison", metavar="FILE"
    ),
    max_tokens: int = opt.MAX_TOKENS,
    n: int = opt.N,
    temperature: float = opt.TEMPERATURE,
    seed: int | None = opt.SEED,
    ignore_eos: bool = opt.sampling_option(False, help="real run: generate max_tokens every time"),
    chat_template: str | None = chat_opt.CHAT_TEMPLATE,
    default_chat_template_kwargs: str | None = chat_opt.DEFAULT_CHAT_TEMPLATE_KWARGS,
    apply_chat_template: bool = chat_opt.APPLY_CHAT_TEMPLATE,
) -> None:
    """Report how well the paged KV cache is used for INPUT and a model.

    Bytes per token, the pool's blocks and tokens, and over the run: live-token utilization,
    internal fragmentation, pool usage, preemptions and prefix-sharing savings; beside them,
    contiguous allocation reserving prompt + max_tokens or max_model_len per sequence; and a
    table over block sizes at the same memory. --simulate runs the scheduler without a model.
    """
    from pagedgen.entrypoints.cli.profile_job import ProfileOptions, profile_job
    from pagedgen.entrypoints.cli.run import _source

    sampling = dict(
        n=n, max_tokens=max_tokens, temperature=temperature, seed=seed, ignore_eos=ignore_eos
    )
    try:
        template = chat_opt.chat_template(
            chat_template, default_chat_template_kwargs, apply_chat_template
        )
    except ValueError as e:
        raise typer.BadParameter(str(e)) from e
    options = ProfileOptions(
        input=replace(spec, reference_column=reference_column),
        engine=engine,
        sampling=sampling,
        sampling_given=frozenset(n for n in sampling if _source(ctx, n) != "DEFAULT"),
        chat_template=template,
        simulate=simulate,
        block_sizes=block_sizes,
        json_output=json_output,
        plot=plot,
    )
    raise typer.Exit(profile_job(options))
