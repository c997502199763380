"""Which width each layer-op launch picks: a 16-byte vector a thread where every row size,
stride and start allows one (rms_norm.cu, silu_and_mul.cu, rope_and_cache.cu), one element a
thread else. The kernels' outputs at both widths: test_emulated_layer_ops.py."""

import torch

from pagedgen.kernels.layer_ops import rms_norm_launch, rope_and_cache_launch, silu_and_mul_launch


def test_layer_ops_move_16_bytes_where_rows_allow() -> None:
    """A vector where every row size, stride and start allows one; one element a thread else."""
    weight = torch.ones(200, dtype=torch.bfloat16)
    x = torch.zeros(3, 400, dtype=torch.bfloat16)
    out = torch.empty(3, 200, dtype=torch.bfloat16)

    def rms_norm_width(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor) -> str:
        launch = rms_norm_launch(out, x, weight, 1e-6)
        assert launch is not None
        return launch.name_expression.rpartition(", ")[2]

    assert rms_norm_width(x[:, :200], weight, out) == "8>"
    assert rms_norm_width(x[:, 1:201], weight, out) == "1>"  # x starts 2 bytes in
    assert rms_norm_width(x[:, :201], torch.ones(201, dtype=torch.bfloat16),
                          torch.empty(3, 201, dtype=torch.bfloat16)) == "1>"  # fmt: skip
    assert rms_norm_width(torch.zeros(3, 201, dtype=torch.bfloat16)[:, :200], weight, out) == "1>"
    assert rms_norm_width(x[:, :200].float(), weight.float(), out.float()) == "4>"

    def silu_width(d: int, dtype: torch.dtype) -> str:
        launch = silu_and_mul_launch(
            torch.empty(2, d, dtype=dtype), torch.empty(2, 2 * d, dtype=dtype)
        )
        assert launch is not None
        return launch.name_expression.rpartition(", ")[2]

    assert [silu_width(d, torch.bfloat16) for d in (296, 300, 301)] == ["8>", "1>", "1>"]
    assert [silu_width(d, torch.float32) for d in (296, 300, 301)] == ["4>", "4>", "1>"]

    def rope_width(dtype: torch.dtype, head_size: int = 64, pad: int = 32, cos_at: int = 0) -> str:
        """pad: extra elements a qkv row; cos_at: where cos and sin start in their storage."""
        num_tokens, width = 3, 4 * head_size  # 2 query heads, 1 kv head
        qkv = torch.zeros(num_tokens, width + pad, dtype=dtype)[:, :width]
        cache = torch.zeros(2, 16, 1, head_size, dtype=dtype)
        rows = torch.zeros(num_tokens * head_size // 2 + cos_at)[cos_at:].view(num_tokens, -1)
        query = torch.empty(num_tokens, 2, head_size, dtype=dtype)
        slots = torch.zeros(num_tokens, dtype=torch.int64)
        launch = rope_and_cache_launch(query, qkv, cache, cache, rows, rows, slots)
        assert launch is not None
        return launch.name_expression.rpartition(", ")[2]

    assert [rope_width(torch.bfloat16, h) for h in (64, 40, 36)] == ["8>", "1>", "1>"]
    assert [rope_width(torch.float32, h) for h in (64, 40, 36)] == ["4>", "4>", "1>"]
    assert rope_width(torch.bfloat16, pad=4) == "1>"  # rows 8 bytes off a vector
    assert rope_width(torch.bfloat16, cos_at=4) == "1>"  # 8 floats: 32 bytes, not 16
    assert rope_width(torch.float32, cos_at=4) == "4>"
    assert rope_width(torch.float32, cos_at=2) == "1>"
