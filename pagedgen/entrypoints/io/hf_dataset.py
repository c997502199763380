"""Hugging Face datasets as input: rows are read one at a time, never loaded whole.

A folder written by save_to_disk and a hub id in the local cache are memory-mapped Arrow files;
parquet/csv/json files (or a folder of them) are streamed.
"""

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from pagedgen import envs
from pagedgen.entrypoints.io.records import NATIVE_FIELDS, InputRecord, parse_native
from pagedgen.entrypoints.io.spec import InputError, InputSpec

BUILDERS = {
    ".parquet": "parquet",
    ".csv": "csv",
    ".json": "json",
    ".jsonl": "json",
    ".arrow": "arrow",
}
PROMPT_COLUMNS = ("prompt", "text", "question", "instruction")


def read_dataset(spec: InputSpec) -> tuple[Iterator[InputRecord], int | None, str | None]:
    """The rows as records, their count where cheap, and a note naming the column read as the
    prompt where no option named it and it is not a "prompt" or "messages" column."""
    rows, columns, total = _load(spec)
    prompt_column, messages_column = _pick_columns(spec, columns)
    for column in (spec.id_column, spec.reference_column):
        if column is not None and column not in columns:
            raise InputError(f"column {column!r} is not in the dataset; its columns: {columns}")
    id_column = spec.id_column or ("id" if "id" in columns else None)
    note = None
    if spec.prompt_column is None and prompt_column not in (None, "prompt"):
        note = (
            f"reading the dataset's column {prompt_column!r} as the prompt (its columns: "
            f"{', '.join(columns)}); --prompt-column or --messages-column names another"
        )

    def records() -> Iterator[InputRecord]:
        for line, row in enumerate(rows, start=1):
            yield _record(row, line, prompt_column, messages_column, id_column, spec)

    return records(), total, note


def _record(
    row: dict[str, Any],
    line: int,
    prompt_column: str | None,
    messages_column: str | None,
    id_column: str | None,
    spec: InputSpec,
) -> InputRecord:
    """A row read as a line of pagedgen's JSONL: its id, prompt or messages from the columns
    chosen, and its sampling, LoRA and chat fields from the columns of those names."""
    obj = {
        name: row[name]
        for name in NATIVE_FIELDS
        if name not in ("id", "prompt", "messages") and row.get(name) is not None
    }
    record_id = row.get(id_column) if id_column else None
    obj["id"] = f"row-{line}" if record_id is None else str(record_id)
    reference = row.get(spec.reference_column) if spec.reference_column else None
    column = messages_column or prompt_column
    assert column is not None
    value = row.get(column)
    if value is None:
        return InputRecord(line, obj["id"], error=f"column {column!r} is null", unit="row")
    obj["messages" if messages_column else "prompt"] = value
    return parse_native(obj, line, "row")._replace(reference=reference)


def _pick_columns(spec: InputSpec, columns: list[str]) -> tuple[str | None, str | None]:
    for column in (spec.prompt_column, spec.messages_column):
        if column is not None and column not in columns:
            raise InputError(f"column {column!r} is not in the dataset; its columns: {columns}")
    if spec.messages_column is not None:
        return None, spec.messages_column
    if spec.prompt_column is not None:
        return spec.prompt_column, None
    if "messages" in columns and "prompt" not in columns:
        return None, "messages"
    for column in PROMPT_COLUMNS:
        if column in columns:
            return column, None
    raise InputError(
        f"no prompt column found among {columns}; name one with --prompt-column or "
        "--messages-column"
    )


def _load(spec: InputSpec) -> tuple[Iterable[dict[str, Any]], list[str], int | None]:
    import datasets

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    path = Path(spec.path).expanduser()
    try:
        if (path / "state.json").is_file() or (path / "dataset_dict.json").is_file():
            ds = datasets.load_from_disk(str(path))
            if isinstance(ds, datasets.DatasetDict):
                if spec.split not in ds:
                    raise InputError(f"split {spec.split!r} is not in {spec.path}: {list(ds)}")
                ds = ds[spec.split]
            return ds, ds.column_names, len(ds)
        if path.is_file():
            builder = BUILDERS.get(path.suffix)
            if builder is None:
                raise InputError(f"{spec.path} is not a parquet, csv, json or arrow file")
            stream = datasets.load_dataset(
                builder, data_files=str(path), split="train", streaming=True
            )
            total = _parquet_rows(path) if builder == "parquet" else None
            return stream, _column_names(stream), total
        if path.is_dir():
            stream = datasets.load_dataset(str(path), split=spec.split, streaming=True)
            return stream, _column_names(stream), None
        ds = _load_cached(datasets, spec)
        return ds, ds.column_names, len(ds)
    except InputError:
        raise
    except Exception as e:  # datasets raises many kinds for a dataset it cannot find or read
        message = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise InputError(f"cannot load dataset {spec.path!r}: {message}") from e


def _load_cached(datasets: Any, spec: InputSpec) -> Any:
    """A hub id from the local cache (memory-mapped Arrow), without reaching for the network
    unless HF_DATASETS_OFFLINE or HF_HUB_OFFLINE says otherwise."""
    offline = datasets.config.HF_HUB_OFFLINE
    if not envs.hf_offline_set():
        datasets.config.HF_HUB_OFFLINE = True
    try:
        return datasets.load_dataset(spec.path, split=spec.split)
    except ConnectionError as e:
        raise InputError(
            f"{spec.path!r} is neither a local file or folder nor a dataset in the local Hugging "
            f"Face cache ({datasets.config.HF_DATASETS_CACHE})"
        ) from e
    finally:
        datasets.config.HF_HUB_OFFLINE = offline


def _column_names(stream: Any) -> list[str]:
    if stream.column_names is not None:
        return list(stream.column_names)
    first = next(iter(stream), None)
    return list(first) if first is not None else []


def _parquet_rows(path: Path) -> int | None:
    import pyarrow
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path).metadata.num_rows
    except (OSError, pyarrow.ArrowException):  # unreadable here: the stream then says why
        return None
