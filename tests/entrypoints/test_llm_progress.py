"""LLM's use_tqdm bar: on a terminal it counts prompts as they finish and ends with the total and
vLLM's token speeds; off a terminal, or with use_tqdm=False, stderr stays empty; an exception in
the middle of a call ends the live display and still leaves the engine empty."""

import re
import sys

import pytest

from pagedgen import LLM, SamplingParams
from pagedgen.core.beam_search import BeamSearchParams
from pagedgen.entrypoints import llm_progress

ENGINE = dict(device="cpu", dtype="float32", attention_backend="cpu", log=lambda m: None)
PROMPTS = ["abc", "hello there", "x", "the quick brown fox"]
PARAMS = [SamplingParams(temperature=0, max_tokens=k, ignore_eos=True) for k in (1, 2, 3, 4)]
STYLE = re.compile(r"\x1b\[[0-9;]*m")
CONTROL = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\r")  # cursor moves and line clears
SPEED = re.compile(r"est\. speed input: ([\d.]+) toks/s, output: ([\d.]+) toks/s")


@pytest.fixture(scope="module")
def llm(tiny_llama_path) -> LLM:
    return LLM(str(tiny_llama_path), kv_cache_memory=0.01, **ENGINE)


@pytest.fixture
def terminal(monkeypatch):
    """stderr as rich sees an interactive terminal, 200 columns wide."""
    for name in ("FORCE_COLOR", "NO_COLOR", "TTY_INTERACTIVE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TTY_COMPATIBLE", "1")
    monkeypatch.setenv("TERM", "xterm-256color")
    monkeypatch.setenv("COLUMNS", "200")


def frames(err: str, first_word: str = "Processed prompts") -> list[str]:
    """The bar's lines (or, with first_word="est. speed", the speed lines) as drawn, one per
    refresh, without escape codes."""
    lines = CONTROL.sub("\n", STYLE.sub("", err)).split("\n")
    return [line for line in lines if line.startswith(first_word)]


def test_bar_counts_prompts_as_they_finish_and_ends_with_token_speeds(
    llm, terminal, capsys, monkeypatch
):
    monkeypatch.setattr(llm_progress, "REFRESH_S", 0.0)
    outputs = llm.generate(PROMPTS, PARAMS)
    captured = capsys.readouterr()
    assert captured.out == ""
    drawn = frames(captured.err)
    counts = [re.search(r" (\d)/4 ", line).group(1) for line in drawn]
    for k in "01234":  # requests of 1, 2, 3 and 4 tokens finish one step apart
        assert k in counts
    assert counts == sorted(counts)
    assert "100%" in drawn[-1] and " 4/4 " in drawn[-1] and "it/s" in drawn[-1]
    num_input, num_output = map(
        float, SPEED.fullmatch(frames(captured.err, "est. speed")[-1]).groups()
    )
    assert num_input > 0 and num_output > 0
    # Both speeds divide by the same elapsed time: their ratio is the ratio of the counts.
    prompt_tokens = sum(out.num_prompt_tokens for out in outputs)
    output_tokens = sum(out.num_output_tokens for out in outputs)
    assert output_tokens == 1 + 2 + 3 + 4
    assert num_input / num_output == pytest.approx(prompt_tokens / output_tokens, rel=0.02)
    assert captured.err.rstrip().endswith("\x1b[?25h")  # the cursor is back


def test_use_tqdm_false_writes_nothing(llm, terminal, capsys):
    llm.generate(PROMPTS, PARAMS, use_tqdm=False)
    assert capsys.readouterr() == ("", "")


def test_nothing_is_written_when_stderr_is_not_a_terminal(llm, monkeypatch, capsys):
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):
        monkeypatch.delenv(name, raising=False)
    assert not sys.stderr.isatty()
    llm.generate(PROMPTS, PARAMS)
    assert capsys.readouterr() == ("", "")


@pytest.mark.parametrize("use_tqdm", [True, False])
def test_chat_and_beam_search_take_use_tqdm(llm, terminal, capsys, use_tqdm):
    llm.chat([{"role": "user", "content": "hi"}], PARAMS[1], use_tqdm=use_tqdm)
    chat = frames(capsys.readouterr().err)
    llm.beam_search(PROMPTS[:2], BeamSearchParams(beam_width=2, max_tokens=2), use_tqdm=use_tqdm)
    beams = frames(capsys.readouterr().err)
    if use_tqdm:
        assert " 1/1 " in chat[-1] and " 2/2 " in beams[-1]
    else:
        assert chat == beams == []


def test_an_exception_mid_call_ends_the_display_and_empties_the_engine(
    llm, terminal, capsys, monkeypatch
):
    monkeypatch.setattr(llm_progress, "REFRESH_S", 0.0)
    stdout, stderr = sys.stdout, sys.stderr
    step, num_steps = llm.engine.step, 0

    def interrupted_step():
        nonlocal num_steps
        num_steps += 1
        if num_steps == 3:
            raise KeyboardInterrupt
        return step()

    monkeypatch.setattr(llm.engine, "step", interrupted_step)
    with pytest.raises(KeyboardInterrupt):
        llm.generate(PROMPTS, PARAMS)
    assert (sys.stdout, sys.stderr) == (stdout, stderr)  # rich's redirection is undone
    err = capsys.readouterr().err
    assert err.rfind("\x1b[?25h") > err.rfind("\x1b[?25l")  # the cursor is shown again
    assert " 4/4 " not in frames(err)[-1]
    assert not llm.engine.has_unfinished_requests()

    monkeypatch.setattr(llm.engine, "step", step)
    assert [len(out.outputs[0].token_ids) for out in llm.generate(PROMPTS, PARAMS)] == [1, 2, 3, 4]
    assert " 4/4 " in frames(capsys.readouterr().err)[-1]
