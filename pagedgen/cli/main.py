import sys
from typing import Any

import typer

try:  # recent typer vendors click
    from typer._click.exceptions import NoArgsIsHelpError, UsageError
except ImportError:
    from click.exceptions import NoArgsIsHelpError, UsageError

from pagedgen.cli.profile import profile
from pagedgen.cli.run import run

EXIT_USAGE = 2


class App(typer.Typer):
    """A Typer app whose usage errors are one line on stderr (exit 2), never a box or a trace."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        kwargs["standalone_mode"] = False
        try:
            code = super().__call__(*args, **kwargs)
        except NoArgsIsHelpError as e:
            print(e.format_message(), file=sys.stderr)
            code = EXIT_USAGE
        except UsageError as e:
            command = e.ctx.command_path if e.ctx else "pagedgen"
            print(f"error: {e.format_message()} (see '{command} --help')", file=sys.stderr)
            code = EXIT_USAGE
        except typer.Abort:
            code = 130
        sys.exit(code if isinstance(code, int) else 0)


app = App(
    add_completion=False,
    no_args_is_help=True,
    help="Offline batch generation with a paged KV cache and continuous batching.",
    pretty_exceptions_enable=False,
)


@app.callback()
def main() -> None:
    """pagedgen: generate completions for a whole file of prompts, as fast as the machine allows."""


app.command()(run)
app.command()(profile)


from pagedgen.cli.bench import bench  # noqa: E402

app.command()(bench)
