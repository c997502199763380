"""StepPlans: a step's attention launches planned by its first layer, re-bound for the others."""

import numpy as np
import pytest
import torch

from pagedgen.attention.metadata import AttentionMetadata
from pagedgen.attention.step_plans import StepPlans, StepViews
from pagedgen.kernels.launch import KernelLaunch, KernelModule

MODULE = KernelModule("k.cu", (), ("k",))


def metadata(query_lens: list[int], context_lens: list[int]) -> AttentionMetadata:
    cu = np.cumsum([0, *query_lens])
    return AttentionMetadata(
        slot_mapping=torch.zeros(int(cu[-1]), dtype=torch.int64),
        cu_seqlens_q=torch.tensor(cu, dtype=torch.int32),
        context_lens=torch.tensor(context_lens, dtype=torch.int32),
        block_tables=torch.arange(len(query_lens) * 4, dtype=torch.int32).view(-1, 4),
        max_seqlen_q=max(query_lens),
        max_context_len=max(context_lens),
        block_size=16,
        num_decode_seqs=next((i for i, q in enumerate(query_lens) if q != 1), len(query_lens)),
        query_lens_cpu=query_lens,
        context_lens_cpu=context_lens,
    )


class Planner:
    """Plans like the kernels' planners: the given tensors as arguments, a scratch tensor of
    its own, scalars between them."""

    def __init__(self) -> None:
        self.num_plans = 0

    def __call__(self, out, query, key_cache, value_cache, scale) -> list[KernelLaunch]:
        self.num_plans += 1
        scratch = torch.empty(3)
        args = (out, scratch, query, np.int32(query.stride(0)), key_cache, value_cache)
        return [
            KernelLaunch(MODULE, "k", (1, 1, 1), (32, 1, 1), (*args, np.float32(scale))),
            KernelLaunch(MODULE, "k", (2, 1, 1), (32, 1, 1), (out, scratch)),
        ]


def layer(num_tokens: int = 5, num_blocks: int = 8) -> tuple[torch.Tensor, ...]:
    query = torch.randn(num_tokens, 4, 64)
    return torch.empty_like(query), query, *torch.zeros(2, num_blocks, 16, 2, 64)


def launches(plans: StepPlans, md: AttentionMetadata, tensors, planner: Planner, scale=0.125):
    return plans.launches(md, "decode", tensors, (scale,), lambda: planner(*tensors, scale))


def test_later_layers_take_the_first_plan_with_their_own_tensors() -> None:
    plans, planner, md = StepPlans(), Planner(), metadata([1, 1, 3], [5, 9, 3])
    first, second = layer(), layer()
    planned = launches(plans, md, first, planner)
    bound = launches(plans, md, second, planner)
    assert planner.num_plans == 1
    expected = planner(*second, 0.125)
    for got, want, old in zip(bound, expected, planned, strict=True):
        assert got._replace(args=()) == want._replace(args=())
        for a, b, c in zip(got.args, want.args, old.args, strict=True):
            if isinstance(b, torch.Tensor) and any(b is t for t in second):
                assert a is b  # the layer's own tensor, in its place
            elif isinstance(a, torch.Tensor):
                assert a is c  # the step's scratch, shared
            else:
                assert a == b
    assert bound[1].args[1] is bound[0].args[1]  # one scratch for both launches


@pytest.mark.parametrize("change", ["scale", "num_tokens", "strided_query", "dtype", "new_step"])
def test_a_layer_unlike_the_first_or_a_new_step_is_planned_anew(change: str) -> None:
    plans, planner, md = StepPlans(), Planner(), metadata([1, 1, 3], [5, 9, 3])
    launches(plans, md, layer(), planner)
    tensors, scale = layer(), 0.125
    if change == "scale":
        scale = 0.5
    elif change == "num_tokens":
        tensors = layer(num_tokens=6)
    elif change == "strided_query":
        out, _, key_cache, value_cache = tensors
        query = torch.randn(5, 8, 64)[:, :4]
        tensors = (out, query, key_cache, value_cache)
    elif change == "dtype":
        tensors = tuple(t.half() for t in tensors)
    else:
        md = metadata([1, 1, 3], [5, 9, 3])
    got = launches(plans, md, tensors, planner, scale)
    assert planner.num_plans == 2
    assert got[0].args[2] is tensors[1] and got[0].args[-1] == np.float32(scale)


def test_a_tensor_in_two_roles() -> None:
    """A first layer whose K and V are one tensor is planned anew by every layer: which of its
    arguments is K no identity tells. A later layer sharing them takes the plan of one that
    does not, each in its place."""
    plans, planner, md = StepPlans(), Planner(), metadata([1, 1, 3], [5, 9, 3])
    out, query, key_cache, _ = layer()
    shared = (out, query, key_cache, key_cache)
    launches(plans, md, shared, planner)
    launches(plans, md, shared, planner)
    assert planner.num_plans == 2
    plans = StepPlans()
    launches(plans, md, layer(), planner)
    got = launches(plans, md, shared, planner)
    assert planner.num_plans == 3
    assert got[0].args[4] is key_cache and got[0].args[5] is key_cache


def test_step_views_are_the_metadata_split_at_the_decode_rows() -> None:
    md = metadata([1, 1, 3, 2], [5, 9, 3, 7])
    views = StepViews.of(md)
    assert torch.equal(views.decode_block_tables, md.block_tables[:2])
    assert torch.equal(views.decode_context_lens, md.context_lens[:2])
    assert views.max_decode_context_len == 9
    assert torch.equal(views.prefill_block_tables, md.block_tables[2:])
    assert torch.equal(views.prefill_cu_seqlens_q, md.cu_seqlens_q[2:])
    assert torch.equal(views.prefill_context_lens, md.context_lens[2:])
    assert views.max_prefill_query_len == 3
    only_decodes = StepViews.of(metadata([1, 1], [4, 2]))
    assert only_decodes.max_prefill_query_len == 0 and only_decodes.max_decode_context_len == 4
