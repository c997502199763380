import math
from dataclasses import replace

import pytest
import torch

from pagedgen.sampling_params import SamplingParams
from pagedgen.worker.sampler import apply_penalties_
from pagedgen.worker.sampling_metadata import SamplingMetadata
from tests.worker.sampler.test_sampler import DEVICES, sample


def test_penalties_match_hand_computation() -> None:
    logits = torch.tensor([[2.0, -1.0, 0.5, -0.5, 3.0], [2.0, -1.0, 0.5, -0.5, 3.0]])
    params = [
        SamplingParams(repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25),
        SamplingParams(),
    ]
    metadata = SamplingMetadata.build(
        params, [[0, 1], [0, 1]], [[2, 2, 3], [2, 2, 3]], "cpu", logits.shape[1]
    )
    penalized = logits.clone()
    apply_penalties_(penalized, metadata)
    # Repetition over prompt + output {0, 1, 2, 3}: [1.0, -2.0, 0.25, -1.0, 3.0]; then token 2
    # (twice in the output) loses 2 * 0.5 + 0.25 and token 3 (once) loses 0.5 + 0.25.
    assert penalized[0].tolist() == [1.0, -2.0, -1.0, -1.75, 3.0]
    assert penalized[1].tolist() == logits[1].tolist()


def test_presence_and_frequency_ignore_prompt_tokens() -> None:
    logits = torch.tensor([[1.0, 1.0, 0.0]])
    params = [SamplingParams(temperature=0, presence_penalty=2.0, frequency_penalty=2.0)]
    assert sample(logits, params, [[0, 0, 0]], [[]]).token_ids == [0]
    assert sample(logits, params, [[1, 1, 1]], [[0]]).token_ids == [1]


def test_repetition_penalty_counts_prompt_tokens() -> None:
    logits = torch.tensor([[3.0, 2.0, -5.0]])
    params = [SamplingParams(temperature=0, repetition_penalty=2.0)]
    assert sample(logits, params, [[0]], [[]]).token_ids == [1]
    assert sample(logits, params, [[2]], [[0]]).token_ids == [1]
    assert sample(logits, params, [[2]], [[2]]).token_ids == [0]


@pytest.mark.parametrize("device", DEVICES)
def test_min_tokens_masks_stop_tokens(device: str) -> None:
    eos, stop = 3, 1
    logits = torch.tensor([[0.0, 9.0, 1.0, 10.0, 0.0]], device=device)
    for temperature in (0.0, 1.0):
        params = SamplingParams(temperature=temperature, min_tokens=3, stop_token_ids=[stop])
        params.all_stop_token_ids = {eos, stop, 1000}  # out-of-vocab ids are ignored
        blocked = sample(logits.expand(500, -1), [params] * 500, None, [[2, 2]] * 500)
        assert set(blocked.token_ids) <= {0, 2, 4}
        free = sample(logits, [params], None, [[2, 2, 2]])
        assert temperature > 0 or free.token_ids == [eos]


@pytest.mark.parametrize("device", DEVICES)
def test_logit_bias_moves_only_the_rows_and_tokens_it_names(device: str) -> None:
    """+5 makes token 0 the argmax of row 0 alone; -100 bans token 1 from row 1's samples; the
    logprobs stay the raw model's; a bias comes before the repetition penalty, as in vLLM."""
    logits = torch.tensor([[1.0, 4.0, 2.0], [1.0, 4.0, 2.0], [1.0, 4.0, 2.0]], device=device)
    params = [
        SamplingParams(temperature=0, logit_bias={0: 5.0}, logprobs=0),
        SamplingParams(temperature=1.0, logit_bias={"1": -100}),
        SamplingParams(temperature=0),
    ]
    out = sample(logits, params)
    assert out.token_ids[0] == 0 and out.token_ids[2] == 1
    assert out.logprobs is not None
    assert out.logprobs[0][0] == pytest.approx(torch.log_softmax(logits[0], 0)[0].item())
    banned = sample(logits[1:2].expand(500, -1), [params[1]] * 500)
    assert 1 not in banned.token_ids
    # bias 3, then penalty 2 on seen token 0: (1 + 3) / 2 = 2 < 2.5; the other way 3.5 would win
    penalized = SamplingParams(temperature=0, logit_bias={0: 3.0}, repetition_penalty=2.0)
    row = torch.tensor([[1.0, 0.0, 2.5]], device=device)
    assert sample(row, [penalized], [[0]]).token_ids == [2]


@pytest.mark.parametrize("device", DEVICES)
def test_allowed_token_ids_restrict_only_their_rows(device: str) -> None:
    logits = torch.tensor([[1.0, 4.0, 2.0, 3.0]] * 3, device=device)
    params = [
        SamplingParams(temperature=0, allowed_token_ids=[0, 2], logprobs=0),
        SamplingParams(temperature=1.0, allowed_token_ids=[0, 3]),
        SamplingParams(temperature=0),
    ]
    out = sample(logits, params)
    assert out.token_ids[0] == 2 and out.token_ids[2] == 1
    assert out.logprobs is not None  # the raw model's, restriction or not
    assert out.logprobs[0][2] == pytest.approx(torch.log_softmax(logits[0], 0)[2].item())
    drawn = sample(logits[1:2].expand(500, -1), [params[1]] * 500).token_ids
    assert set(drawn) == {0, 3}


@pytest.mark.parametrize(
    "logit_bias,message",
    [({"x": 1}, "keys must be token ids"), ({5: 101}, "in \\[-100, 100\\]"), ([1], "map")],
)
def test_logit_bias_must_map_token_ids_to_bounded_biases(logit_bias, message) -> None:
    with pytest.raises(ValueError, match=message):
        SamplingParams(logit_bias=logit_bias)
    with pytest.raises(ValueError, match="non-empty list of token ids"):
        SamplingParams(allowed_token_ids=[])


@pytest.mark.parametrize("device", DEVICES)
def test_logprobs_come_from_raw_logits(device: str) -> None:
    torch.manual_seed(0)
    logits = torch.randn(3, 50, device=device)
    logits[0, 7] = 10.0  # penalized below to move the greedy choice away from the raw top token
    params = [
        SamplingParams(temperature=0, logprobs=5, repetition_penalty=100.0),
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=1.0, logprobs=0),
    ]
    out = sample(logits, params, [[7], [7], [7]], [[], [], []])
    raw = logits.float().log_softmax(dim=-1)
    assert out.logprobs is not None and out.logprobs[1] is None
    row = out.logprobs[0]
    assert out.token_ids[0] != 7
    assert list(row)[0] == out.token_ids[0]
    top_ids = raw[0].topk(5).indices.tolist()
    assert list(row)[1:] == [t for t in top_ids if t != out.token_ids[0]]
    for token_id, logprob in row.items():
        assert math.isclose(logprob, raw[0, token_id].item(), abs_tol=1e-5)
    for i in (0, 2):  # the sampled token's rank in the whole vocabulary, in the top 5 or not
        chosen = raw[i, out.token_ids[i]]
        assert out.logprobs[i].rank == int((raw[i] > chosen).sum()) + 1
    assert out.logprobs[0].rank > 1  # the penalty moved the choice off the raw top token
    assert out.logprobs[2] == pytest.approx({out.token_ids[2]: raw[2, out.token_ids[2]].item()})


def test_logprobs_keep_sampled_token_first_when_in_top_k() -> None:
    logits = torch.tensor([[0.0, 3.0, 2.0, 1.0]])
    out = sample(logits, [SamplingParams(temperature=0, logprobs=3)])
    assert out.logprobs is not None
    assert list(out.logprobs[0]) == [1, 2, 3]
    assert sum(math.exp(v) for v in out.logprobs[0].values()) < 1.0


def test_bad_words_ban_the_token_that_would_complete_them() -> None:
    """[4] is banned everywhere; [2, 3] only right after a 2."""
    logits = torch.tensor([[0.0, 1.0, 2.0, 5.0, 4.0]] * 3)
    # as the engine fills it: a copy (dataclasses.replace), which derives plain_greedy anew
    params = replace(SamplingParams(temperature=0), bad_words_token_ids=[[4], [2, 3]])
    out = sample(logits, [params] * 3, None, [[1], [1, 2], []])
    assert out.token_ids == [3, 2, 3]  # after a 2, 3 and 4 are banned and 2 is the best left


@pytest.mark.parametrize(
    ("fields", "plain"),
    [
        ({}, True),
        ({"top_p": 0.5, "top_k": 3, "seed": 7, "max_tokens": 4, "stop": ["x"]}, True),
        ({"temperature": 0.5}, False),
        ({"logprobs": 0}, False),
        ({"min_tokens": 2}, False),
        ({"repetition_penalty": 1.2}, False),
        ({"presence_penalty": 0.1}, False),
        ({"frequency_penalty": -0.1}, False),
        ({"logit_bias": {1: 2.0}}, False),
        ({"allowed_token_ids": [1, 2]}, False),
        ({"bad_words_token_ids": [[2]]}, False),
    ],
)
def test_plain_greedy_rows_build_the_general_paths_metadata(fields: dict, plain: bool) -> None:
    """A batch whose every row is plain greedy (no logits edits, no logprobs) builds in one pass
    the metadata the general build gives it; any other field takes the general build."""
    engine_fields = {"bad_words_token_ids"} & fields.keys()
    user_fields = {k: v for k, v in fields.items() if k not in engine_fields}
    params = replace(  # as the engine fills its fields: a copy, which derives plain_greedy anew
        SamplingParams(**{"temperature": 0, **user_fields}), **{k: fields[k] for k in engine_fields}
    )
    assert params.plain_greedy == plain
    batch = [SamplingParams(temperature=0), params, SamplingParams(temperature=0, max_tokens=3)]
    inputs = ([[1, 2]] * 3, [[2], [], [3]], "cpu", 5)
    metadata = SamplingMetadata.build(batch, *inputs)
    if plain:
        assert metadata == SamplingMetadata.greedy(3)
    general = [replace(p) for p in batch]
    for p in general:
        p.plain_greedy = False  # no fast path
    expected = SamplingMetadata.build(general, *inputs)
    for name in SamplingMetadata.__slots__:
        got, want = getattr(metadata, name), getattr(expected, name)
        if isinstance(want, torch.Tensor):
            assert torch.equal(got, want), name
        else:
            assert got == want, name
