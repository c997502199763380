"""Output records without a model: one set of keys for every record, and logprobs as vLLM's."""

from pagedgen.entrypoints.io.output import RecordFormatter, logprob_positions
from pagedgen.entrypoints.io.records import parse_native
from pagedgen.outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput


class Letters:
    """A tokenizer whose token i is the letter chr(97 + i)."""

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(97 + t) for t in token_ids)


def test_logprob_positions_rank_the_chosen_token_and_the_k_likeliest():
    # the engine's steps: the chosen token's logprob first, then the k likeliest
    inside = {1: Logprob(-0.5, 2), 0: Logprob(-0.2, 1)}  # 1 is the second likeliest
    outside = {3: Logprob(-4.0, 9), 0: Logprob(-0.2, 1), 1: Logprob(-0.5, 2)}  # not in the top 2
    first, second = logprob_positions([1, 3], [inside, outside], 2, lambda t: chr(97 + t))
    assert (first["token_id"], first["token"], first["logprob"], first["rank"]) == (1, "b", -0.5, 2)
    assert [(t["token_id"], t["token"], t["rank"]) for t in first["top_logprobs"]] == [
        (0, "a", 1),
        (1, "b", 2),
    ]
    assert (second["token_id"], second["rank"]) == (3, 9)
    assert [t["token_id"] for t in second["top_logprobs"]] == [0, 1]
    assert logprob_positions([5, 6], [None, {6: Logprob(-1.0, 4)}], 0) == [
        None,
        {"token_id": 6, "token": None, "logprob": -1.0, "rank": 4, "top_logprobs": []},
    ]


def test_the_engine_ranks_a_chosen_token_outside_the_k_likeliest():
    from pagedgen.core.logprobs import TokenLogprobs, as_logprobs

    ranked = as_logprobs(TokenLogprobs({3: -4.0, 0: -0.2, 1: -0.5}, 17))
    assert ranked == {3: Logprob(-4.0, 17), 0: Logprob(-0.2, 1), 1: Logprob(-0.5, 2)}
    assert as_logprobs({1: -0.5, 0: -0.2}) == {1: Logprob(-0.5, 2), 0: Logprob(-0.2, 1)}


def test_a_record_has_the_same_keys_and_types_whatever_n_or_error():
    formatter = RecordFormatter(False, "m", Letters())
    record = parse_native({"prompt": [1, 2]}, 1)
    completions = [
        CompletionOutput(
            i,
            text,
            [2, 3],
            logprobs=[{2: Logprob(-0.1, 1)}, {3: Logprob(-0.2, 1)}],
            finish_reason="length",
        )
        for i, text in enumerate(["cd", "dc"])
    ]
    metrics = RequestMetrics(arrival_time=1.0, first_token_time=1.5, finished_time=2.0)
    lines = [
        formatter.output(record, RequestOutput("0", None, [1, 2], completions[:n], metrics), 0)
        for n in (1, 2)
    ]
    lines.append(formatter.error(record, "the prompt is too long", 2))
    assert len({tuple(line) for line in lines}) == 1  # the same keys, in the same order
    one, two, error = lines
    assert (one["text"], two["text"], error["text"]) == ("cd", "cd", None)
    assert [c["text"] for c in two["outputs"]] == ["cd", "dc"] and error["outputs"] == []
    assert two["completion_tokens"] == 4 and two["latency"] == 1.0
    assert error["latency"] is None and error["finish_reason"] == "error"
    steps = two["outputs"][1]["logprobs"]
    assert [(s["token_id"], s["token"], s["top_logprobs"]) for s in steps] == [
        (2, "c", []),
        (3, "d", []),
    ]
