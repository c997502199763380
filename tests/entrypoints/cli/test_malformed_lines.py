"""A corpus of over a thousand malformed lines mixed with good ones: no crash, one error record
per bad line naming its line number, and the good lines' outputs identical to a clean run."""

import json
import random

from tests.cli_util import read_records, run_in_process, tiny

MAX_MODEL_LEN = 512  # the tiny model's


def bad_lines(rng: random.Random) -> list[bytes]:
    """One of each kind of bad line, in many variants; each must fail on its own."""
    kinds = [
        lambda i: b'{"prompt": "unterminated',
        lambda i: b"{'prompt': 'single quotes'}",
        lambda i: b'{"prompt": "x"} trailing',
        lambda i: b"[1, 2, 3]",
        lambda i: b"42",
        lambda i: b"null",
        lambda i: b'"just a string"',
        lambda i: b"{}",
        lambda i: b'{"id": "only-id"}',
        lambda i: b'{"prompt": "a", "messages": [{"role": "user", "content": "b"}]}',
        lambda i: b'{"prompt": 3.5}',
        lambda i: b'{"prompt": {"text": "a"}}',
        lambda i: b'{"prompt": ["a", "b"]}',
        lambda i: b'{"prompt": [1, 2.5]}',
        lambda i: b'{"prompt": ""}',
        lambda i: b'{"prompt": []}',
        lambda i: b'{"messages": "hello"}',
        lambda i: b'{"messages": []}',
        lambda i: b'{"messages": [{"content": "no role"}]}',
        lambda i: b'{"messages": [{"role": "user", "content": ["a"]}]}',
        lambda i: b'{"prompt": "a", "temperature": "hot"}',
        lambda i: b'{"prompt": "a", "max_tokens": "5"}',
        lambda i: b'{"prompt": "a", "n": 1.0}',
        lambda i: b'{"prompt": "a", "seed": true}',
        lambda i: b'{"prompt": "a", "stop": [1]}',
        lambda i: b'{"prompt": "a", "temperature": -1}',
        lambda i: b'{"prompt": "a", "top_p": 0}',
        lambda i: b'{"prompt": "a", "max_tokens": 0}',
        lambda i: b'{"prompt": "a", "n": 100000}',
        lambda i: b'{"prompt": "a", "logprobs": 100000}',
        lambda i: b'{"prompt": "a", "top_k": 2.5}',
        lambda i: b'{"prompt": "a", "prompt_logprobs": -1}',
        lambda i: b'{"prompt": "a", "logit_bias": {"x": 1}}',
        lambda i: b'{"prompt": "a", "logit_bias": {"5": 1000}}',
        lambda i: b'{"prompt": "a", "logit_bias": [5]}',
        lambda i: json.dumps({"prompt": "a", "logit_bias": {str(100000 + i): 1}}).encode(),
        lambda i: b'{"prompt": "a", "truncate_prompt_tokens": 0}',
        lambda i: b'{"prompt": "a", "allowed_token_ids": []}',
        lambda i: b'{"prompt": "a", "bad_words": [""]}',
        lambda i: b'{"prompt": "a", "bad_words": [3]}',
        lambda i: b'{"prompt": "a", "allowed_token_ids": ["a"]}',
        lambda i: json.dumps({"prompt": "a", "allowed_token_ids": [3, 100000 + i]}).encode(),
        lambda i: json.dumps({"prompt": [7] * (MAX_MODEL_LEN + 1 + i % 50)}).encode(),
        lambda i: json.dumps({"prompt": "long " * (MAX_MODEL_LEN + i % 50)}).encode(),
        lambda i: json.dumps({"prompt": [1, 2, 100000 + i]}).encode(),
        lambda i: json.dumps({"prompt": [-1 - i]}).encode(),
        lambda i: json.dumps({"id": ["list"], "prompt": "a"}).encode(),
        lambda i: json.dumps({"id": "good-0", "prompt": "duplicate of a good id"}).encode(),
        lambda i: b'{"prompt": "bad \xff\xfe bytes"}',
        lambda i: b"\xc3\x28 not utf-8 at all",
        lambda i: b'{"prompt": "cut off by a zero byte \x00',
        lambda i: bytes(rng.randrange(1, 256) for _ in range(40)).replace(b"\n", b" "),
        lambda i: b"x" * (50_000 + i),
    ]
    return [kinds[i % len(kinds)](i) for i in range(1100)]


def good_rows(count: int) -> list[dict]:
    rows = []
    for i in range(count):
        if i % 3 == 0:
            rows.append({"id": f"good-{i}", "messages": [{"role": "user", "content": f"q{i}"}]})
        elif i % 3 == 1:
            rows.append({"id": f"good-{i}", "prompt": f"prompt {i} " * (1 + i % 4)})
        else:
            rows.append({"id": f"good-{i}", "prompt": [10 + i, 20, 30], "max_tokens": 3})
    return rows


def test_malformed_corpus(tiny_llama_path, tmp_path, capsys):
    rng = random.Random(0)
    good = good_rows(24)
    bad = bad_lines(rng)
    lines: list[bytes | dict] = [*good[1:], *bad]
    rng.shuffle(lines)
    lines.insert(0, good[0])  # before the bad line that duplicates its id
    corpus, clean = tmp_path / "corpus.jsonl", tmp_path / "clean.jsonl"
    encoded = [json.dumps(x).encode() if isinstance(x, dict) else x for x in lines]
    corpus.write_bytes(b"\n".join(encoded[:500]) + b"\n\n   \n" + b"\n".join(encoded[500:]) + b"\n")
    good_ids = [x["id"] for x in lines if isinstance(x, dict)]
    clean.write_text("".join(json.dumps(x) + "\n" for x in lines if isinstance(x, dict)))

    options = tiny(tiny_llama_path, max_tokens=4)
    code, _, stderr = run_in_process(
        capsys, "run", str(corpus), "-o", str(tmp_path / "out.jsonl"), *options
    )
    assert code == 1, stderr[-3000:]
    assert f"{len(bad)} failed" in stderr
    code, _, stderr = run_in_process(
        capsys, "run", str(clean), "-o", str(tmp_path / "ref.jsonl"), *options
    )
    assert code == 0, stderr[-3000:]

    records = read_records(tmp_path / "out.jsonl")
    physical = corpus.read_bytes().split(b"\n")[:-1]
    nonblank = [n for n, raw in enumerate(physical, start=1) if raw.strip()]
    assert [r["line"] for r in records] == nonblank  # one record per line, in input order
    errors = [r for r in records if r["error"] is not None]
    assert len(errors) == len(bad)
    for r in errors:
        assert r["error"].startswith(f"line {r['line']}: ") and r["finish_reason"] == "error"
    outputs = {r["id"]: r for r in records if r["error"] is None}
    assert list(outputs) == good_ids
    for expected in read_records(tmp_path / "ref.jsonl"):
        got = outputs[expected["id"]]
        for field in ("text", "finish_reason", "prompt_tokens", "completion_tokens"):
            assert got[field] == expected[field], (expected["id"], field)
