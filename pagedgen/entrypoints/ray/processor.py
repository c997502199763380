from collections.abc import Callable
from typing import Any

import pyarrow as pa

from pagedgen.entrypoints.io.records import parse_native
from pagedgen.entrypoints.ray.config import ProcessorConfig, require_ray
from pagedgen.entrypoints.ray.replica import LLMReplica

Row = dict[str, Any]
OUTPUT_FIELDS = (
    "text",
    "finish_reason",
    "prompt_tokens",
    "completion_tokens",
    "time_to_first_token",
    "latency",
    "outputs",
    "prompt_logprobs",
    "error",
)


def map_replicas(ds: Any, config: ProcessorConfig, replica: type[LLMReplica]) -> Any:
    """ds through an actor pool of config.concurrency replicas, batch_size rows per call.

    Ray Data restarts a replica that dies and retries the batches it held (its defaults for
    actor pools: max_restarts=-1, max_task_retries=-1); a batch's rows come out once, from the
    call that finished it.
    """
    ray = require_ray()
    # The config rides in the class (pickled with it), not in the object store: a restarted
    # replica never depends on an object the driver might have released.
    bound = type(replica.__name__, (replica,), {"config": config})
    return ds.map_batches(
        bound,
        batch_size=config.batch_size,
        batch_format="pyarrow",
        compute=ray.data.ActorPoolStrategy(size=config.concurrency),
        num_cpus=config.num_cpus,
        num_gpus=config.num_gpus,
    )


class RowReplica(LLMReplica):
    """A replica for rows of any dataset: each row keeps its columns and gains the output fields
    of a `pagedgen run` record (text, finish_reason, token counts, timings, error, outputs with
    each completion's logprobs, prompt_logprobs)."""

    def __call__(self, batch: pa.Table) -> pa.Table:  # type: ignore[override]
        rows = batch.to_pylist()
        records = [parse_native(_request_of(row), 1, unit="row") for row in rows]
        lines = self.complete(records)
        out = []
        for row, record, line in zip(rows, records, lines):
            fields = {name: line[name] for name in OUTPUT_FIELDS if name in line}
            if fields["error"] is not None:  # no position: a dataset's rows have none here
                fields["error"] = fields["error"].removeprefix(f"{record.where}: ")
            out.append({**row, **fields})
        return pa.Table.from_pylist(out)


class Processor:
    """ds -> ds: preprocess each row, complete it on the replicas, postprocess it."""

    def __init__(
        self,
        config: ProcessorConfig,
        preprocess: Callable[[Row], Row] | None = None,
        postprocess: Callable[[Row], Row] | None = None,
    ) -> None:
        self.config = config
        self.preprocess = preprocess
        self.postprocess = postprocess

    def __call__(self, ds: Any) -> Any:
        if self.preprocess is not None:
            ds = ds.map(self.preprocess)
        ds = map_replicas(ds, self.config, RowReplica)
        if self.postprocess is not None:
            ds = ds.map(self.postprocess)
        return ds


def build_processor(
    config: ProcessorConfig,
    preprocess: Callable[[Row], Row] | None = None,
    postprocess: Callable[[Row], Row] | None = None,
) -> Processor:
    """A processor in the shape of ray.data.llm's build_llm_processor.

    preprocess turns a dataset row into a request row as a `pagedgen run` line: "prompt" or
    "messages", optionally "id" and sampling fields (top-level, or in a "sampling_params" dict as
    ray.data.llm's rows have them). The completed row keeps its columns and gains "text",
    "finish_reason", "prompt_tokens", "completion_tokens", "time_to_first_token", "latency",
    "outputs", "prompt_logprobs" and "error" (None, or why the row could not run: a bad row never
    fails the job); postprocess then maps it. Nothing runs until the returned dataset is consumed.
    """
    require_ray()
    return Processor(config, preprocess, postprocess)


def _request_of(row: Row) -> Row:
    """A row as a `pagedgen run` line: nulls (Arrow's fill for absent fields) dropped."""
    request = {name: value for name, value in row.items() if value is not None}
    sampling = request.pop("sampling_params", None)
    if isinstance(sampling, dict):
        request.update({name: value for name, value in sampling.items() if value is not None})
    return request
