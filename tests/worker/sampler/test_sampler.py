import random

import pytest
import torch

from pagedgen.sampling_params import SamplingParams
from pagedgen.worker import sampler
from pagedgen.worker.sampler import (
    Sampler,
    SamplerOutput,
    apply_top_k_top_p,
    apply_top_k_top_p_sorted,
)
from pagedgen.worker.sampling_metadata import SamplingMetadata

# The CUDA cases carry the gpu mark, so that `pytest -m gpu` on a GPU machine runs them too.
DEVICES = ["cpu"] + (
    [pytest.param("cuda", marks=pytest.mark.gpu)] if torch.cuda.is_available() else []
)


@pytest.fixture(autouse=True)
def seeded_logits():
    """The random logits the tests build come from a fixed seed; the sampler's draws come from
    its own generator (see sample), never from torch's global one."""
    torch.manual_seed(0)


def sample(
    logits: torch.Tensor,
    params: list[SamplingParams],
    prompt_token_ids: list[list[int]] | None = None,
    output_token_ids: list[list[int]] | None = None,
    generator: torch.Generator | None = None,
) -> SamplerOutput:
    num_seqs = len(params)
    metadata = SamplingMetadata.build(
        params,
        prompt_token_ids or [[0]] * num_seqs,
        output_token_ids or [[]] * num_seqs,
        logits.device,
        logits.shape[1],
    )
    generator = generator or torch.Generator(logits.device).manual_seed(0)
    return Sampler(generator)(logits, metadata)


def sampled_set(probs: list[float], device: str, num_samples: int = 4000, **kwargs) -> set[int]:
    logits = torch.tensor(probs, device=device).log().expand(num_samples, -1)
    return set(sample(logits, [SamplingParams(**kwargs)] * num_samples).token_ids)


@pytest.mark.parametrize("device", DEVICES)
def test_all_greedy_is_argmax_without_tensors(device: str) -> None:
    logits = torch.randn(8, 100, device=device)
    params = [SamplingParams(temperature=0)] * 8
    metadata = SamplingMetadata.build(params, [[1, 2]] * 8, [[3]] * 8, device, 100)
    assert metadata.all_greedy
    assert metadata.temperatures is None and metadata.repetition_coords is None
    assert metadata.output_penalty_coords is None and metadata.banned_coords is None
    out = Sampler()(logits, metadata)
    assert out.token_ids == logits.argmax(dim=-1).tolist()
    assert out.logprobs is None


@pytest.mark.parametrize("device", DEVICES)
def test_mixed_batch_greedy_rows_are_argmax(device: str) -> None:
    logits = torch.randn(64, 50, device=device)
    params = [
        SamplingParams(temperature=0) if i % 2 else SamplingParams(temperature=1.5, top_k=5)
        for i in range(64)
    ]
    token_ids = sample(logits, params).token_ids
    argmax = logits.argmax(dim=-1).tolist()
    assert all(token_ids[i] == argmax[i] for i in range(1, 64, 2))
    # Random rows do not all fall on the argmax.
    assert any(token_ids[i] != argmax[i] for i in range(0, 64, 2))


@pytest.mark.parametrize("device", DEVICES)
def test_seed_is_independent_of_batch_and_row(device: str) -> None:
    vocab_size = 1000
    row = torch.randn(vocab_size, device=device)
    seeded = SamplingParams(temperature=1.0, seed=1234)
    others = [
        SamplingParams(temperature=0.7),
        SamplingParams(temperature=0),
        SamplingParams(temperature=1.0, top_k=3, seed=99),
        SamplingParams(temperature=2.0, top_p=0.5, repetition_penalty=1.3),
    ]
    alone, in_batch = [], []
    for step in range(20):
        output = list(range(step))
        alone.append(sample(row.unsqueeze(0), [seeded], [[5]], [output]).token_ids[0])
        logits = torch.randn(5, vocab_size, device=device)
        logits[3] = row
        params = others[:3] + [seeded] + others[3:]
        outputs = [[7] * step, [], [1, 2], output, [9]]
        in_batch.append(sample(logits, params, [[5]] * 5, outputs).token_ids[3])
    assert alone == in_batch
    assert len(set(alone)) > 1  # the seed moves on with the step


def test_different_seeds_differ_and_unseeded_rows_use_the_samplers_generator() -> None:
    logits = torch.zeros(1, 1000)

    def draw(seed: int | None, generator_seed: int = 0) -> list[int]:
        generator = torch.Generator().manual_seed(generator_seed)
        params = [SamplingParams(seed=seed)]
        return [
            sample(logits, params, [[0]], [[0] * step], generator).token_ids[0]
            for step in range(10)
        ]

    assert draw(1) == draw(1) == draw(1, generator_seed=1)  # a seeded row ignores the generator
    assert draw(1) != draw(2)
    assert draw(None) == draw(None)  # unseeded rows: the engine's generator, not torch's global
    assert draw(None) != draw(None, generator_seed=1)


@pytest.mark.parametrize("device", DEVICES)
def test_top_k_allowed_set(device: str) -> None:
    probs = [0.1, 0.3, 0.05, 0.25, 0.3 - 1e-3]
    assert sampled_set(probs, device, top_k=2) == {1, 4}
    assert sampled_set(probs, device, top_k=3) == {1, 3, 4}
    assert sampled_set(probs, device, top_k=0) == {0, 1, 2, 3, 4}
    assert sampled_set(probs, device, top_k=100) == {0, 1, 2, 3, 4}


@pytest.mark.parametrize("device", DEVICES)
def test_top_p_and_min_p_allowed_sets(device: str) -> None:
    probs = [0.5, 0.3, 0.15, 0.05]
    assert sampled_set(probs, device, top_p=0.4) == {0}
    assert sampled_set(probs, device, top_p=0.7) == {0, 1}
    assert sampled_set(probs, device, top_p=0.85) == {0, 1, 2}
    assert sampled_set(probs, device, top_p=0.99) == {0, 1, 2, 3}
    # top_k first, then top_p over the renormalized survivors: 0.5/0.95 + 0.3/0.95 = 0.84.
    assert sampled_set(probs, device, top_k=3, top_p=0.8) == {0, 1}
    assert sampled_set(probs, device, top_k=3, top_p=0.9) == {0, 1, 2}
    # min_p keeps probabilities >= min_p * 0.5.
    assert sampled_set(probs, device, min_p=0.2) == {0, 1, 2}
    assert sampled_set(probs, device, min_p=0.5) == {0, 1}
    # ... of the tempered distribution, as in vLLM: (0.3 / 0.5) ** 2 = 0.36 < 0.5.
    assert sampled_set(probs, device, min_p=0.5, temperature=0.5) == {0}


@pytest.mark.parametrize("device", DEVICES)
def test_filters_are_row_wise(device: str) -> None:
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05], device=device).log()
    kinds = [
        SamplingParams(top_k=1),
        SamplingParams(top_p=0.7),
        SamplingParams(min_p=0.2),
        SamplingParams(),
        SamplingParams(temperature=0),
    ]
    params = kinds * 1000
    token_ids = sample(probs.expand(len(params), -1), params).token_ids
    allowed = [{0}, {0, 1}, {0, 1, 2}, {0, 1, 2, 3}, {0}]
    for i, expected in enumerate(allowed):
        assert set(token_ids[i :: len(kinds)]) == expected


@pytest.mark.parametrize("seeded", [False, True])
def test_frequencies_follow_tempered_softmax(seeded: bool) -> None:
    num_samples = 20000
    logits = torch.tensor([0.0, 1.0, 2.0, 3.0]).expand(num_samples, -1)
    params = [
        SamplingParams(temperature=2.0, seed=i if seeded else None) for i in range(num_samples)
    ]
    counts = torch.bincount(torch.tensor(sample(logits, params).token_ids), minlength=4)
    expected = (logits[0] / 2.0).softmax(dim=-1)
    assert torch.allclose(counts / num_samples, expected, atol=0.015)


def test_top_k_top_p_keeps_the_nucleus() -> None:
    rng = random.Random(0)
    num_checked = 0
    for case in range(300):
        vocab_size, top_k, top_p = rng.randint(1, 40), rng.randint(0, 45), rng.uniform(0.01, 1.0)
        logits = torch.randn(vocab_size, generator=torch.Generator().manual_seed(case))
        kept = logits.argsort(descending=True).tolist()[: top_k or vocab_size]
        probs = logits[kept].softmax(dim=0).tolist()
        mass_before = [sum(probs[:i]) for i in range(len(kept))]
        if any(abs(m - top_p) < 1e-4 for m in mass_before):
            continue  # too close to call in float32
        masked = apply_top_k_top_p(
            logits.unsqueeze(0),
            torch.tensor([top_k]) if top_k else None,
            torch.tensor([top_p]) if top_p < 1 else None,
            min(top_k, vocab_size),
        )
        expected = {t for t, m in zip(kept, mass_before, strict=True) if m < top_p}
        assert set(torch.isfinite(masked[0]).nonzero().flatten().tolist()) == expected, case
        num_checked += 1
    assert num_checked > 250


@pytest.mark.parametrize("scale, expect_full_sort", [(8.0, False), (0.1, True)])
def test_top_p_candidates_match_full_sort(
    monkeypatch: pytest.MonkeyPatch, scale: float, expect_full_sort: bool
) -> None:
    generator = torch.Generator().manual_seed(0)
    num_seqs, vocab_size = 64, 5000
    logits = torch.randn(num_seqs, vocab_size, generator=generator) * scale
    top_k = torch.randint(1, 200, (num_seqs,), generator=generator)
    top_k[::3] = 0
    top_k[1] = 2000  # more than NUM_TOP_P_CANDIDATES
    top_p = torch.rand(num_seqs, generator=generator) * 0.98 + 0.01
    top_p[1::4] = 1.0
    num_full_sorts = []

    def counting_sorted(*args: torch.Tensor) -> torch.Tensor:
        num_full_sorts.append(1)
        return apply_top_k_top_p_sorted(*args)

    monkeypatch.setattr(sampler, "apply_top_k_top_p_sorted", counting_sorted)
    max_top_k = int(top_k.max())
    masked = apply_top_k_top_p(logits, top_k, top_p, max_top_k)
    assert bool(num_full_sorts) == expect_full_sort
    kept = torch.isfinite(masked)
    k = torch.where(top_k == 0, vocab_size, top_k)
    expected = apply_top_k_top_p_sorted(logits, k, top_p)
    assert torch.equal(kept, torch.isfinite(expected))
    assert torch.equal(masked[kept], logits[kept])
    assert kept[2::4].sum(dim=-1).min() < kept[2::4].sum(dim=-1).max()  # top_p did cut

    top_k[1] = 150  # top_k alone: rows without one keep every token
    masked = apply_top_k_top_p(logits, top_k, None, int(top_k.max()))
    k = torch.where(top_k == 0, vocab_size, top_k)
    expected = apply_top_k_top_p_sorted(logits, k, torch.ones(num_seqs))
    assert torch.equal(torch.isfinite(masked), torch.isfinite(expected))
    assert torch.isfinite(masked[::3]).all()


def test_input_logits_are_left_alone_and_any_float_dtype_works() -> None:
    logits = torch.randn(2, 10)
    before = logits.clone()
    params = [
        SamplingParams(temperature=0, repetition_penalty=2.0, presence_penalty=1.0, min_tokens=2),
        SamplingParams(top_p=0.5, logprobs=2),
    ]
    params[0].all_stop_token_ids = {3}
    sample(logits, params, [[1, 2], [1]], [[3], [4]])
    assert torch.equal(logits, before)
    greedy = [SamplingParams(temperature=0)] * 2
    assert sample(logits.bfloat16(), greedy).token_ids == logits.bfloat16().argmax(-1).tolist()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_sampling_never_makes_the_host_wait_for_the_gpu() -> None:
    """Async scheduling queues the next step while the GPU samples this one: no filter may read a
    device value on the host. set_sync_debug_mode('error') raises on any such read."""
    logits = torch.randn(64, 5000, device="cuda")
    params = [
        SamplingParams(temperature=0, logprobs=2),
        SamplingParams(temperature=0.8, top_k=40, seed=7, min_tokens=2, stop_token_ids=[3, 9999]),
        SamplingParams(temperature=1.0, top_p=0.9, min_p=0.05),
        SamplingParams(temperature=1.2, top_k=3000, top_p=0.99, logprobs=1),
    ] * 16
    metadata = SamplingMetadata.build(params, [[1]] * 64, [[2]] * 64, "cuda", logits.shape[1])
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        pending = Sampler(torch.Generator("cuda").manual_seed(0)).sample(logits, metadata)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    out = pending.result()
    assert len(out.token_ids) == 64 and out.token_ids[0] == int(logits[0].argmax())
