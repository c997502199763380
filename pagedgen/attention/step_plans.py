"""A step's attention kernel launches, planned by its first layer and re-bound for the others."""

from collections.abc import Callable
from typing import NamedTuple

import torch

from pagedgen.attention.metadata import AttentionMetadata
from pagedgen.kernels.launch import KernelLaunch

Planner = Callable[[], list[KernelLaunch]]
LayerTensors = tuple[torch.Tensor | None, ...]


def geometry(t: torch.Tensor | None) -> tuple | None:
    """All a planner's checks and launches read of a tensor but its data: two tensors of one
    geometry pass the same checks and take the same launches, each with itself as argument."""
    if t is None:
        return None
    return (t.shape, t.stride(), t.dtype, t.get_device(), t.data_ptr() % 16)


class StepViews(NamedTuple):
    """The parts of a step's metadata the decode and the prefill kernels read, sliced once a step
    rather than once a layer: decode rows come first, prefill rows after them."""

    decode_block_tables: torch.Tensor
    decode_context_lens: torch.Tensor
    max_decode_context_len: int
    prefill_block_tables: torch.Tensor
    prefill_cu_seqlens_q: torch.Tensor
    prefill_context_lens: torch.Tensor
    max_prefill_query_len: int

    @classmethod
    def of(cls, metadata: AttentionMetadata) -> "StepViews":
        n = metadata.num_decode_seqs
        return cls(
            metadata.block_tables[:n],
            metadata.context_lens[:n],
            max(metadata.context_lens_cpu[:n], default=0),
            metadata.block_tables[n:],
            metadata.cu_seqlens_q[n:],
            metadata.context_lens[n:],
            max(metadata.query_lens_cpu[n:], default=0),
        )


class StepPlans:
    """Every layer of a step attends over the same metadata, and layers alike in geometry (query
    rows, output, caches, sinks and slopes; the rest of their AttentionSpec and kernel choices)
    take the same launches but for the tensors they pass. So the first such layer of a step plans
    them in full (arguments checked, kernel chosen, modules picked, grid and scratch sized), and
    the others swap their own tensors in, as vLLM builds its attention metadata once a step.

    A planner puts the tensors it is given into its launches as they are, never a view of one;
    the scratch it allocates (v2's partial results) is shared by the step's layers, which run one
    after another on one stream. A step is known by its metadata object: a new one starts anew.
    """

    def __init__(self) -> None:
        self.metadata: AttentionMetadata | None = None
        self.views: StepViews | None = None
        self.seq_order: torch.Tensor | None = None  # decode rows, longest context first
        # key -> (the first layer's launches, _slots of them)
        self.plans: dict[tuple, tuple[list[KernelLaunch], list[tuple[tuple[int, int], ...]]]] = {}

    def step_views(self, metadata: AttentionMetadata) -> StepViews:
        if metadata is not self.metadata:
            self.metadata, self.views, self.plans = metadata, StepViews.of(metadata), {}
            self.seq_order = None
        return self.views

    def longest_first(self, metadata: AttentionMetadata) -> torch.Tensor:
        """The step's decode rows by context length, longest first, sorted on the device once a
        step (inside a decode graph, once a replay): a seq_order for the decode kernels."""
        views = self.step_views(metadata)
        if self.seq_order is None:
            order = torch.argsort(views.decode_context_lens, descending=True)
            self.seq_order = order.to(torch.int32)
        return self.seq_order

    def launches(
        self,
        metadata: AttentionMetadata,
        kind: str,
        tensors: LayerTensors,  # the layer's own: swapped in by identity
        scalars: tuple,  # everything else the plan depends on but the step's metadata
        plan: Planner,  # plans this layer's launches in full
    ) -> list[KernelLaunch]:
        self.step_views(metadata)
        key = (kind, scalars, *map(geometry, tensors))
        planned = self.plans.get(key)
        if planned is None:
            launches = plan()
            slots = _slots(launches, tensors)
            if slots is not None:
                self.plans[key] = (launches, slots)
            return launches
        launches, slots = planned
        bound = []
        for launch, launch_slots in zip(launches, slots):
            args = list(launch.args)
            for arg, tensor in launch_slots:
                args[arg] = tensors[tensor]
            bound.append(launch._replace(args=tuple(args)))
        return bound


def _slots(
    launches: list[KernelLaunch], tensors: LayerTensors
) -> list[tuple[tuple[int, int], ...]] | None:
    """For each launch, (argument index, index in tensors) of every argument that is one of the
    layer's tensors; None where a tensor plays two roles (the same object as K and V), which no
    swap by identity could tell apart."""
    given = {id(t): i for i, t in enumerate(tensors) if t is not None}
    if len(given) < sum(t is not None for t in tensors):
        return None
    return [
        tuple((j, given[id(a)]) for j, a in enumerate(launch.args) if id(a) in given)
        for launch in launches
    ]
