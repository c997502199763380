"""On CPUs with AMX, the cpu backend sends long bfloat16 prompts to torch's SDPA (its tiles run on
AMX) and the rest of a step's rows to our kernels. Forced here on any CPU by setting the
backend's threshold: the split rows against the reference, and the layers that must stay with
our kernels (windows, soft caps, sinks, ALiBi)."""

import pytest
import torch

from pagedgen.attention import cpu_backend as cpu_backend_module
from pagedgen.attention import get_attention_backend
from pagedgen.attention.cpu_backend import prefill_plan, sdpa_prompt_min_tokens
from pagedgen.attention.reference import ReferenceAttentionBackend
from pagedgen.kernels.cpu import cpu_kernel_error
from tests.test_attention import make_batch

pytestmark = pytest.mark.skipif(
    cpu_kernel_error() is not None, reason=f"no CPU kernel: {cpu_kernel_error()}"
)

# decode rows; a whole prompt (long), a short one, a long chunk after cached context, a
# recompute whose prompt rows are long and whose last rows were sampled
QUERY_LENS = [1, 1, 24, 5, 16, 30]
CONTEXT_LENS = [9, 40, 24, 5, 50, 30]
PROMPT_LENS = [9, 40, 24, 5, 60, 20]
MIN_TOKENS = 10


def run(
    options: dict, sdpa_min_tokens: int | None, before=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The backend's rows and the reference's for one layer of options; before(), if given,
    runs between prepare() and that layer (an earlier layer of the same step)."""
    torch.manual_seed(0)
    num_heads, num_kv_heads, head_dim, block_size, num_blocks = 6, 2, 64, 16, 48
    md = make_batch(QUERY_LENS, CONTEXT_LENS, block_size, num_blocks, 0)
    md.prompt_lens_cpu = PROMPT_LENS
    backend = get_attention_backend("cpu", torch.device("cpu"), head_dim, block_size)
    backend.sdpa_min_tokens = sdpa_min_tokens
    num_tokens = sum(QUERY_LENS)
    query = torch.randn(num_tokens, num_heads, head_dim).bfloat16()
    key, value = (torch.randn(num_tokens, num_kv_heads, head_dim).bfloat16() for _ in range(2))
    cache = torch.randn(2, num_blocks, block_size, num_kv_heads, head_dim).bfloat16()
    ref_cache = cache.clone()
    backend.prepare(md)
    if before is not None:
        before(backend, query, key, value, md)
    out = backend.forward(query, key, value, cache[0], cache[1], md, 0.125, **options)
    reference = ReferenceAttentionBackend()
    ref = reference.forward(query, key, value, ref_cache[0], ref_cache[1], md, 0.125, **options)
    return out, ref


def test_the_plan_sends_long_prompt_rows_to_sdpa():
    md = make_batch(QUERY_LENS, CONTEXT_LENS, 16, 48, 0)
    md.prompt_lens_cpu = PROMPT_LENS
    plan = prefill_plan(md, MIN_TOKENS)
    # (sequence, first prefill row, prompt rows, context they end): the whole prompt, the chunk
    # after 34 cached tokens, the recompute's 20 prompt rows (its last 10 were sampled)
    assert plan.sdpa == [(2, 0, 24, 24), (4, 29, 16, 50), (5, 45, 20, 20)]
    assert plan.prompt[2].tolist() == [5]  # the short prompt stays with the tiled kernel
    rows, _, _ = plan.sampled
    assert rows.tolist() == list(range(65, 75))
    assert prefill_plan(md).sdpa == []


@pytest.mark.parametrize("min_tokens", [MIN_TOKENS, None])
def test_split_rows_match_the_reference(min_tokens):
    out, ref = run({}, min_tokens)
    torch.testing.assert_close(out.float(), ref.float(), atol=1.6e-2, rtol=1.6e-2)


@pytest.mark.parametrize(
    "options",
    [
        dict(window=7),
        dict(softcap=5.0),
        dict(sinks=torch.linspace(-3.0, 3.0, 6)),
        dict(alibi_slopes=torch.linspace(0.05, 0.5, 6)),
    ],
)
def test_layers_sdpa_cannot_compute_stay_with_the_kernels(options, monkeypatch):
    """Forced to SDPA, a window, soft cap, sink or ALiBi would be dropped: such layers must not
    reach it (a plan made for a plain layer of the same step must not be reused for them)."""
    calls = []
    real = cpu_backend_module.prefill_sequence
    monkeypatch.setattr(
        cpu_backend_module, "prefill_sequence", lambda *a: calls.append(1) or real(*a)
    )

    def plain_layer(backend, query, key, value, md):
        cache = torch.zeros(2, 48, 16, 2, 64, dtype=torch.bfloat16)
        backend.forward(query, key, value, cache[0], cache[1], md, 0.125)
        assert len(calls) == 3  # its long prompts went to SDPA
        calls.clear()

    out, ref = run(options, MIN_TOKENS, before=plain_layer)
    assert not calls
    torch.testing.assert_close(out.float(), ref.float(), atol=1.6e-2, rtol=1.6e-2)


def test_only_cpus_with_amx_send_prompts_to_sdpa(monkeypatch):
    monkeypatch.setattr(cpu_backend_module, "has_amx_bf16", lambda: False)
    assert sdpa_prompt_min_tokens() is None
    monkeypatch.setattr(cpu_backend_module, "has_amx_bf16", lambda: True)
    monkeypatch.setattr(cpu_backend_module, "onednn_matmul_dtypes", lambda: (torch.bfloat16,))
    assert sdpa_prompt_min_tokens() == cpu_backend_module.SDPA_PROMPT_MIN_TOKENS
