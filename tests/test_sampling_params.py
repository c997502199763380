"""SamplingParams refuses what a step could not run, when it is built: values out of range, and
floats or strings in integer fields (which would otherwise fail deep in a step, taking every
request of the batch with them). Plain Python, no model."""

import numpy as np
import pytest

from pagedgen import SamplingParams


@pytest.mark.parametrize(
    "fields,message",
    [
        (dict(n=0), "n must be >= 1"),
        (dict(temperature=-0.1), "temperature must be >= 0"),
        (dict(top_p=0), "top_p must be in"),
        (dict(max_tokens=0), "max_tokens must be >= 1"),
        (dict(min_tokens=5, max_tokens=4), "min_tokens must be <= max_tokens"),
        (dict(n=2.5), "n must be an integer, got 2.5"),
        (dict(top_k=2.5), "top_k must be an integer"),
        (dict(max_tokens=3.5), "max_tokens must be an integer"),
        (dict(seed="abc"), "seed must be an integer, got 'abc'"),
        (dict(logprobs=1.0), "logprobs must be an integer"),
        (dict(n=True), "n must be an integer"),
        (dict(stop_token_ids=[2.0]), "stop_token_ids must be token ids"),
        (dict(allowed_token_ids=["a"]), "allowed_token_ids must be token ids"),
    ],
)
def test_bad_fields_fail_when_built(fields, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**fields)


def test_numpy_integers_become_ints():
    params = SamplingParams(n=np.int64(2), seed=np.int32(7), max_tokens=np.uint16(5))
    assert (params.n, params.seed, params.max_tokens) == (2, 7, 5)
    assert all(type(v) is int for v in (params.n, params.seed, params.max_tokens))
    assert SamplingParams(max_tokens=None, seed=None).max_tokens is None


def test_clone_is_a_deep_copy():
    params = SamplingParams(stop=["x"], logit_bias={3: 1.0}, stop_token_ids=[4])
    copy = params.clone()
    assert copy == params and copy is not params
    copy.stop.append("y")
    copy.logit_bias[5] = 2.0
    assert params.stop == ["x"] and params.logit_bias == {3: 1.0}
