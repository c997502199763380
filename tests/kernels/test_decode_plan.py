"""plan_decode: the decode kernel's choice, a pure function of the step's shape, the device and
the options, checked without a GPU."""

import pytest

from pagedgen.kernels.decode_plan import (
    PARTITION_SIZE,
    DecodeKernel,
    DecodeShape,
    plan_decode,
    use_v1,
)
from pagedgen.kernels.paged_attention_grouped import DEFAULT_NUM_SMS


def shape(
    num_heads=32, num_kv_heads=8, head_size=128, num_seqs=64, max_context_len=1024, plain=True
):
    return DecodeShape(num_seqs, num_heads, num_kv_heads, head_size, 16, max_context_len, plain)


def plan(step: DecodeShape, mma_supported: bool = True, **options):
    return plan_decode(step, DEFAULT_NUM_SMS, mma_supported, **options)


def test_per_head_by_default_one_pass_or_partitions_by_vllms_rule() -> None:
    for step in (shape(num_seqs=64), shape(num_seqs=1, max_context_len=4096)):
        chosen = plan(step)
        assert chosen.kernel is DecodeKernel.PER_HEAD and chosen.grid_x == step.num_heads
        one_pass = use_v1(step.max_context_len, step.num_seqs, step.num_heads, PARTITION_SIZE)
        assert chosen.version == (1 if one_pass else 2)
        assert chosen.partition_size == PARTITION_SIZE and not chosen.l2_prefetch


@pytest.mark.parametrize(
    "num_heads, num_kv_heads, head_size, kernel",
    [
        (32, 8, 128, DecodeKernel.MMA),  # groups of 4: tensor cores first
        (9, 3, 64, DecodeKernel.MMA),  # of 3
        (16, 8, 128, DecodeKernel.PER_HEAD),  # of 2: neither
    ],
)
def test_auto_picks_tensor_cores_for_groups_of_three_or_more(
    num_heads, num_kv_heads, head_size, kernel
) -> None:
    step = shape(num_heads, num_kv_heads, head_size)
    auto = dict(grouped=None, l2_prefetch=None, tensor_cores=None)
    assert plan(step, **auto).kernel is kernel


def test_auto_grouped_where_tensor_cores_are_not_supported() -> None:
    auto = dict(grouped=None, l2_prefetch=None, tensor_cores=None)
    grouped = plan(shape(32, 8, 128), mma_supported=False, **auto)
    assert grouped.kernel is DecodeKernel.GROUPED and not grouped.l2_prefetch
    assert grouped.grid_x == 8 * (4 // grouped.tile)
    per_head = plan(shape(32, 8, 64), mma_supported=False, **auto)  # heads under 128
    assert per_head.kernel is DecodeKernel.PER_HEAD and per_head.l2_prefetch


def test_the_grouped_kernel_declines_options_and_layers_without_gqa() -> None:
    assert plan(shape(plain=False), grouped=True).kernel is DecodeKernel.PER_HEAD
    assert plan(shape(8, 8), grouped=True).kernel is DecodeKernel.PER_HEAD
    assert plan(shape(), grouped=True).kernel is DecodeKernel.GROUPED
    # asked for, grouped wins over tensor cores left to the rule
    assert plan(shape(), grouped=True, tensor_cores=None).kernel is DecodeKernel.GROUPED


def test_tensor_cores_take_every_option_where_supported() -> None:
    assert plan(shape(plain=False), tensor_cores=True).kernel is DecodeKernel.MMA
    assert plan(shape(), tensor_cores=True, mma_supported=False).kernel is DecodeKernel.PER_HEAD


def test_forced_version_and_partition_size() -> None:
    forced = plan(shape(), version=2, partition_size=128)
    assert (forced.version, forced.partition_size) == (2, 128)
    assert plan(shape(num_seqs=1, max_context_len=8192), version=1).version == 1
