"""`run --shard I/N` over N processes, then `merge`: the single run's output, in input order;
merge refuses parts with a record missing, repeated or torn. No Ray needed."""

import json

import pytest

from pagedgen.entrypoints.io.records import InputRecord
from pagedgen.entrypoints.io.shard import Shard, parse_shard
from tests.cli_util import read_records, run_in_process, tiny, write_jsonl

NUM_PROMPTS = 30
TIMING = ("time_to_first_token", "latency")


def without_timing(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING} for r in records]


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    rows = [{"id": f"p{i}", "prompt": f"shard me {i} " * (1 + i % 3)} for i in range(NUM_PROMPTS)]
    rows[4] = {"id": "p4", "prompt": ""}  # an error record
    return write_jsonl(tmp_path_factory.mktemp("shard") / "in.jsonl", rows)


def run_shards(capsys, model, prompts, folder):
    """The single run's output and the three shards' outputs, run in this process."""
    single = folder / "single.jsonl"
    code, _, err = run_in_process(capsys, "run", str(prompts), "-o", str(single), *tiny(model))
    assert code == 1, err  # the empty prompt
    parts = []
    for i in range(3):
        part = folder / f"part{i}.jsonl"
        args = ["run", str(prompts), "-o", str(part), "--shard", f"{i}/3", *tiny(model)]
        code, _, err = run_in_process(capsys, *args)
        assert code in (0, 1), err
        parts.append(part)
    return single, parts


def test_shards_partition_the_input():
    assert parse_shard("2/3") == Shard(2, 3)
    records = [InputRecord(line, f"r{line}") for line in range(1, 11)]
    taken = [[r.line for r in Shard(i, 3).filter(iter(records))] for i in range(3)]
    assert sorted(sum(taken, [])) == list(range(1, 11))
    assert [len(t) for t in taken] == [Shard(i, 3).size_of(10) for i in range(3)]
    for bad in ("3/3", "1", "a/2", "-1/2"):
        with pytest.raises(ValueError, match="shard must be"):
            parse_shard(bad)


def test_shards_then_merge_equal_the_single_run(capsys, tiny_llama_path, prompts, tmp_path):
    single, parts = run_shards(capsys, tiny_llama_path, prompts, tmp_path)
    for i, part in enumerate(parts):
        assert all((r["line"] - 1) % 3 == i for r in read_records(part))
    merged = tmp_path / "merged.jsonl"
    code, _, err = run_in_process(
        capsys, "merge", *map(str, parts), "-o", str(merged), "--input", str(prompts)
    )
    assert code == 0, err
    assert f"{NUM_PROMPTS} records, 1 of them errors" in err
    assert without_timing(read_records(merged)) == without_timing(read_records(single))
    check_refusals(capsys, prompts, parts, tmp_path / "refused.jsonl")


def check_refusals(capsys, prompts, parts, merged) -> None:
    def merge(*args: str) -> tuple[int, str]:
        code, _, err = run_in_process(capsys, "merge", *args, "-o", str(merged))
        return code, err

    code, err = merge(str(parts[0]), str(parts[1]))
    assert code == 1 and "have no record: 3, 6," in err
    assert not merged.exists()
    # the last shard missing: only the input tells
    code, err = merge(str(parts[0]), str(parts[2]), "--input", "nowhere.jsonl")
    assert code == 2 and "not found" in err
    code, err = merge(str(parts[0]), str(parts[1]), "--input", str(prompts))
    assert code == 1 and "10 input lines have no record" in err

    repeated = merged.parent / "repeated.jsonl"
    first = parts[1].read_text().splitlines()[0]
    repeated.write_text(first + "\n")
    code, err = merge(*map(str, parts), str(repeated))
    assert code == 1 and f"input line {json.loads(first)['line']} has two records" in err

    torn = merged.parent / "torn.jsonl"
    torn.write_bytes(parts[2].read_bytes()[:-5])
    code, err = merge(str(parts[0]), str(parts[1]), str(torn))
    assert code == 1 and "torn record" in err
    assert not merged.exists()


def test_bad_shard_is_a_usage_error(capsys, tiny_llama_path, prompts, tmp_path):
    args = ["run", str(prompts), "-o", str(tmp_path / "out.jsonl"), "--shard", "3/3"]
    code, _, err = run_in_process(capsys, *args, *tiny(tiny_llama_path))
    assert code == 2 and "--shard" in err


def test_merge_refuses_an_output_that_is_a_part_or_the_input(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    parts = [
        write_jsonl(tmp_path / "p0.jsonl", [{"id": "a", "line": 1}, {"id": "c", "line": 3}]),
        write_jsonl(tmp_path / "p1.jsonl", [{"id": "b", "line": 2}]),
    ]
    src = write_jsonl(tmp_path / "in.jsonl", [{"prompt": p} for p in "abc"])
    (tmp_path / "link.jsonl").symlink_to(parts[1])
    before = [path.read_bytes() for path in (*parts, src)]
    for output, read in (
        (str(parts[0]), "the part 'p0.jsonl'"),
        ("./p1.jsonl", "the part 'p1.jsonl'"),
        ("link.jsonl", "the part 'p1.jsonl'"),
        ("in.jsonl", "the input 'in.jsonl'"),
    ):
        args = ["merge", "p0.jsonl", "p1.jsonl", "-o", output, "--input", "in.jsonl"]
        code, _, err = run_in_process(capsys, *args, "--overwrite")
        assert code == 2, err
        assert f"the output {output!r} is {read}; write it elsewhere" in err, err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert [path.read_bytes() for path in (*parts, src)] == before
