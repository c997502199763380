import typer
from rich.console import Console
from rich.markup import escape

from pagedgen.entrypoints.io.merge import MergeError, merge_parts
from pagedgen.entrypoints.io.spec import InputError, InputSpec
from pagedgen.entrypoints.io.writer import OutputWriteError

EXIT_OK, EXIT_INCOMPLETE, EXIT_USAGE, EXIT_IO_ERROR = 0, 1, 2, 74


def merge(
    parts: list[str] = typer.Argument(
        ..., metavar="PARTS...", help="part files, or folders of *.jsonl part files"
    ),
    output: str = typer.Option(
        ..., "--output", "-o", help="the merged JSONL ('-' = stdout)", metavar="FILE"
    ),
    input: str | None = typer.Option(
        None,
        "--input",
        help="the input the parts answer: check its records exactly [default: lines 1..last]",
        metavar="INPUT",
    ),
    overwrite: bool = typer.Option(False, "--overwrite", help="replace an OUTPUT with records"),
) -> None:
    """Merge the outputs of `run --shard I/N` (or a `--output-format parts` folder) into one
    output in input order. Refuses, writing nothing, unless every input line has exactly one
    record. Exit codes: 0 merged, 1 a record missing, repeated or torn, 2 usage error, 74 the
    output could not be written.
    """
    console = Console(stderr=True, soft_wrap=True, highlight=False)
    try:
        spec = InputSpec(input) if input is not None else None
        result = merge_parts(parts, output, spec, overwrite)
    except MergeError as e:
        console.print(f"[red]error:[/] {escape(str(e))}")
        raise typer.Exit(EXIT_INCOMPLETE) from None
    except (InputError, ValueError) as e:
        console.print(f"[red]error:[/] {escape(str(e))}")
        raise typer.Exit(EXIT_USAGE) from None
    except (OutputWriteError, OSError) as e:
        console.print(f"[red]error:[/] cannot write {escape(output)}: {e}")
        raise typer.Exit(EXIT_IO_ERROR) from None
    failed = f", {result.num_failed} of them errors" if result.num_failed else ""
    console.print(f"merged {result.num_parts} parts: {result.num_records} records{failed}")
