"""The cpu backend's prefill rows: prompt rows by the AMX kernel where the CPU has AMX and the
layer is one it takes (bfloat16), else by the tiled kernel; rows past a prompt by
the decode kernel. Against the reference on every CPU, and the routing checked by recording the
kernel calls (the AMX request replayed on the tiled kernel where there is no AMX)."""

import pytest
import torch

from pagedgen.attention import cpu_backend as cpu_backend_module
from pagedgen.attention import get_attention_backend
from pagedgen.attention.cpu_backend import prefill_plan
from pagedgen.attention.reference import ReferenceAttentionBackend
from pagedgen.kernels.cpu import cpu_kernel_error
from tests.attention.calls import forward
from tests.attention.test_backends import make_batch

pytestmark = pytest.mark.skipif(
    cpu_kernel_error() is not None, reason=f"no CPU kernel: {cpu_kernel_error()}"
)

# decode rows; a whole prompt (long), a short one, a long chunk after cached context, a
# recompute whose prompt rows are long and whose last rows were sampled
QUERY_LENS = [1, 1, 24, 5, 16, 30]
CONTEXT_LENS = [9, 40, 24, 5, 50, 30]
PROMPT_LENS = [9, 40, 24, 5, 60, 20]
MIN_TOKENS = 10


def run(options: dict, dtype: torch.dtype = torch.bfloat16) -> tuple[torch.Tensor, torch.Tensor]:
    """The backend's rows and the reference's for one layer of options."""
    torch.manual_seed(0)
    num_heads, num_kv_heads, head_dim, block_size, num_blocks = 6, 2, 64, 16, 48
    md = make_batch(QUERY_LENS, CONTEXT_LENS, block_size, num_blocks, 0)
    md.prompt_lens_cpu = PROMPT_LENS
    backend = get_attention_backend("cpu", torch.device("cpu"), head_dim, block_size)
    num_tokens = sum(QUERY_LENS)
    query = torch.randn(num_tokens, num_heads, head_dim).to(dtype)
    key, value = (torch.randn(num_tokens, num_kv_heads, head_dim).to(dtype) for _ in range(2))
    cache = torch.randn(2, num_blocks, block_size, num_kv_heads, head_dim).to(dtype)
    ref_cache = cache.clone()
    backend.prepare(md)
    out = forward(backend, query, key, value, cache[0], cache[1], md, 0.125, **options)
    reference = ReferenceAttentionBackend()
    ref = forward(reference, query, key, value, ref_cache[0], ref_cache[1], md, 0.125, **options)
    return out, ref


def test_the_plan_splits_prompt_rows_from_sampled_ones():
    md = make_batch(QUERY_LENS, CONTEXT_LENS, 16, 48, 0)
    md.prompt_lens_cpu = PROMPT_LENS
    plan = prefill_plan(md)
    # (first row, prompt rows, context they end) of the whole prompts, the chunk after 34 cached
    # tokens and the recompute's 20 prompt rows (its last 10 were sampled)
    tables, starts, lens, contexts = plan.prompt
    assert starts.tolist() == [0, 24, 29, 45] and lens.tolist() == [24, 5, 16, 20]
    assert contexts.tolist() == [24, 5, 50, 20]
    rows, _, _ = plan.sampled
    assert rows.tolist() == list(range(65, 75))


OPTIONS = [
    {},
    dict(window=7),
    dict(softcap=5.0),
    dict(sinks=torch.linspace(-3.0, 3.0, 6)),
    dict(alibi_slopes=torch.linspace(0.05, 0.5, 6)),
]


@pytest.mark.parametrize("options", OPTIONS)
def test_rows_match_the_reference(options):
    out, ref = run(options)
    torch.testing.assert_close(out.float(), ref.float(), atol=1.6e-2, rtol=1.6e-2)


@pytest.mark.parametrize("options", OPTIONS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_prompt_rows_go_to_amx_where_it_takes_them(options, dtype, monkeypatch):
    calls = []
    real = cpu_backend_module.paged_attention_prefill
    amx_here = cpu_backend_module.amx_error() is None

    def recorded(*args, amx=False, **kwargs):
        calls.append(amx)
        return real(*args, amx=amx and amx_here, **kwargs)

    monkeypatch.setattr(cpu_backend_module, "paged_attention_prefill", recorded)
    monkeypatch.setattr(cpu_backend_module, "amx_error", lambda: None)
    out, ref = run(options, dtype)
    assert calls == [dtype == torch.bfloat16]
    tolerance = 1.6e-2 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(out.float(), ref.float(), atol=tolerance, rtol=tolerance)
