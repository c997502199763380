import sys
from typing import Any

import typer

try:  # recent typer vendors click
    from typer._click.exceptions import NoArgsIsHelpError, NoSuchOption, UsageError
except ImportError:
    from click.exceptions import NoArgsIsHelpError, NoSuchOption, UsageError

import pagedgen
from pagedgen.entrypoints.cli.help import SectionedCommand
from pagedgen.entrypoints.cli.profile import profile
from pagedgen.entrypoints.cli.run import run

EXIT_USAGE = 2
# vLLM's options that pagedgen does not take, and why: said instead of a near name's suggestion
UNSUPPORTED_OPTIONS = {
    "--best-of": "is not supported (vLLM V1 dropped best_of too): --n N returns N completions",
}


class App(typer.Typer):
    """A Typer app whose usage errors are one line on stderr (exit 2), never a box or a trace.

    Commands find the command line they were given in ctx.obj (for the resume hint).
    """

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        kwargs["standalone_mode"] = False
        kwargs.setdefault("obj", list(kwargs.get("args") or sys.argv[1:]))
        try:
            code = super().__call__(*args, **kwargs)
        except NoArgsIsHelpError as e:
            _print_error(e.format_message())
            code = EXIT_USAGE
        except UsageError as e:
            command = e.ctx.command_path if e.ctx else "pagedgen"
            message = e.format_message()
            if isinstance(e, NoSuchOption) and e.option_name in UNSUPPORTED_OPTIONS:
                message = f"{e.option_name} {UNSUPPORTED_OPTIONS[e.option_name]}"
            _print_error(f"error: {message} (see '{command} --help')")
            code = EXIT_USAGE
        except typer.Abort:
            code = 130
        sys.exit(code if isinstance(code, int) else 0)


def _print_error(message: str) -> None:
    if sys.stderr is not None:  # closed (2>&-): print would fall back to stdout, the records'
        print(message, file=sys.stderr)


app = App(
    add_completion=False,
    no_args_is_help=True,
    help="Offline batch generation with a paged KV cache and continuous batching.",
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain help: it reads at 80 columns and never cuts an option
    context_settings={"help_option_names": ["-h", "--help"]},  # commands' contexts inherit it
)


def _print_version(given: bool) -> None:
    if given:
        print(f"pagedgen {pagedgen.__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: bool = typer.Option(
        False,
        "--version",
        is_eager=True,
        callback=_print_version,
        help="Show the version and exit.",
    ),
) -> None:
    """pagedgen: generate completions for a whole file of prompts, as fast as the machine allows."""


app.command(cls=SectionedCommand, short_help="Complete every request of INPUT into OUTPUT.")(run)
app.command(cls=SectionedCommand)(profile)


from pagedgen.entrypoints.cli.bench import bench  # noqa: E402

app.command(cls=SectionedCommand, short_help="Benchmark pagedgen against transformers.")(bench)

from pagedgen.entrypoints.cli.merge import merge  # noqa: E402

app.command(short_help="Merge shard outputs into one, in input order.")(merge)
