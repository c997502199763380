"""The block manager with a sliding window: blocks wholly before the window go back to the pool
as a sequence grows, and forks, swaps, prefix hits and frees keep the freed prefix right."""

from pagedgen.core.block_manager import NULL_BLOCK, BlockManager
from pagedgen.model_config import freeable_window, layer_sliding_windows
from tests.core.block_manager.test_block_manager import admit, decode, make_seq


def test_blocks_before_the_window_are_freed_as_the_sequence_grows():
    bm = BlockManager(num_blocks=16, block_size=4, num_cpu_blocks=16, sliding_window=6)
    seq = make_seq(10)
    admit(bm, seq)  # 3 blocks, none freed yet: the prompt's queries saw them all
    assert bm.num_used_blocks == 3
    for _ in range(30):
        decode(bm, seq)
        bm.check_integrity()
        # the step's query, at position num_computed_tokens - 1, sees the 6 tokens ending there
        first_needed = (seq.num_computed_tokens - 1 - 6 + 1) // 4
        assert seq.block_table[:first_needed] == [NULL_BLOCK] * first_needed
        assert NULL_BLOCK not in seq.block_table[first_needed:]
        assert bm.num_used_blocks <= 3
    assert bm.num_sliding_window_freed_blocks == len(seq.block_table) - bm.num_used_blocks
    bm.free(seq)
    bm.check_integrity()
    assert bm.num_used_blocks == 0


def test_fork_swap_and_prefix_hits_skip_freed_blocks():
    bm = BlockManager(num_blocks=16, block_size=4, num_cpu_blocks=16, sliding_window=5)
    seq = make_seq(12)
    admit(bm, seq)
    for _ in range(8):
        decode(bm, seq)
    assert seq.block_table[0] == NULL_BLOCK
    child = seq.fork(99)
    bm.fork(seq, child)
    bm.check_integrity()
    mapping = bm.swap_out([seq, child])
    assert mapping is not None and len(mapping) == len(set(seq.block_table) - {NULL_BLOCK})
    assert seq.block_table[0] == child.block_table[0] == NULL_BLOCK
    bm.check_integrity()
    for s in (seq, child):
        s.append_token_id(0)
    assert bm.swap_in([seq, child], [1, 1]) is not None
    for s in (seq, child):
        s.num_computed_tokens += 1
    bm.check_integrity()
    assert seq.block_table[0] == NULL_BLOCK
    # a new prompt with the same first blocks revives the freed, still-hashed blocks
    again = make_seq(seq.token_ids[:12])
    plans = admit(bm, again)
    assert plans[0].num_computed_tokens == 8
    bm.check_integrity()
    for s in (seq, child, again):
        bm.free(s)
    bm.check_integrity()
    assert bm.num_used_blocks == 0


class Config:
    num_hidden_layers = 4
    sliding_window = 8


def test_layer_windows_from_configs():
    mistral = type("C", (Config,), {"model_type": "mistral"})
    assert layer_sliding_windows(mistral) == [8] * 4 and freeable_window(mistral) == 8
    qwen2 = type("C", (Config,), dict(model_type="qwen2", max_window_layers=2))
    assert layer_sliding_windows(qwen2) == [None] * 4  # use_sliding_window defaults to off
    qwen2.use_sliding_window = True
    assert layer_sliding_windows(qwen2) == [None, None, 8, 8] and freeable_window(qwen2) is None
    gemma = type(
        "C",
        (Config,),
        dict(model_type="gemma2", layer_types=["sliding_attention", "full_attention"] * 2),
    )
    assert layer_sliding_windows(gemma) == [8, None, 8, None]
