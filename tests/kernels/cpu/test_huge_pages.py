import torch

from pagedgen.kernels import cpu_gemm_bf16
from pagedgen.kernels.huge_pages import HUGE_PAGE_BYTES, empty_huge
from tests.kernels.cpu.test_gemm_bf16 import needs_kernel


def test_empty_huge_is_a_writable_flat_tensor():
    for numel in (7, HUGE_PAGE_BYTES // 2 + 3):  # under one huge page, and over
        t = empty_huge(numel, torch.int16)
        assert t.shape == (numel,) and t.dtype == torch.int16 and t.is_contiguous()
        t.fill_(-3)
        assert int(t[-1]) == -3 and int(t.sum()) == -3 * numel


@needs_kernel
def test_pack_in_huge_pages_matches_the_dense_weight():
    torch.manual_seed(0)
    weight = torch.randn(1040, 1024, dtype=torch.bfloat16)  # packs to more than 2 MiB
    packed = cpu_gemm_bf16.pack(weight)
    assert packed.numel() * 2 >= HUGE_PAGE_BYTES
    panels = packed.view(-1, 1024 // 2, 16, 2)  # [n / 16][k / 2][16][2]
    expected = weight.view(torch.int16).view(-1, 16, 1024 // 2, 2).transpose(1, 2)
    assert torch.equal(panels, expected)
