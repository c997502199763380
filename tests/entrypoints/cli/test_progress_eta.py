"""The ETA that `pagedgen run` shows, from deterministic runs fed to its progress display: it
converges on the time actually left instead of growing as requests finish in bursts."""

import io
import random
import re
from types import SimpleNamespace

import pytest
from rich.console import Console

from pagedgen.core.stats import EngineStats
from pagedgen.entrypoints.batch.job import JobProgress
from pagedgen.entrypoints.batch.metrics import RunMetrics
from pagedgen.entrypoints.cli import progress as progress_module
from pagedgen.entrypoints.cli.progress import RunProgress

MAX_TOKENS = 256


def simulate(lengths: list[int], max_num_seqs: int, step_s: float):
    """Continuous batching of requests of these output lengths, one token per running request a
    step, each step step_s long: yields the engine's stats and the run's metrics after each."""
    waiting, running = list(lengths), []
    stats, metrics = EngineStats(), RunMetrics(start=0.0)
    now = 0.0
    while waiting or running:
        while waiting and len(running) < max_num_seqs:
            running.append([waiting.pop(0), 0])
        now += step_s
        stats.num_steps += 1
        for request in running:
            request[1] += 1
            stats.num_generation_tokens += 1
        for request in [r for r in running if r[1] == r[0]]:
            running.remove(request)
            metrics.num_completed += 1
            metrics.num_output_tokens += request[1]
            metrics.max_num_output_tokens = max(metrics.max_num_output_tokens, request[1])
        stats.num_running = len(running)
        yield now, stats, metrics


def shown_etas(monkeypatch, lengths: list[int], max_num_seqs: int, step_s: float):
    """(seconds actually left, the ETA shown) for each plain progress line of a simulated run."""
    clock = SimpleNamespace(now=0.0)
    monkeypatch.setattr(progress_module.time, "perf_counter", lambda: clock.now)
    end = sum(1 for _ in simulate(lengths, max_num_seqs, step_s)) * step_s
    stream = io.StringIO()
    shown = []
    with RunProgress(Console(file=stream, width=300), enabled=True) as display:
        display.last_log = 0.0
        for now, stats, metrics in simulate(lengths, max_num_seqs, step_s):
            clock.now = now
            engine = SimpleNamespace(stats=stats, num_unfinished_requests=stats.num_running)
            num_lines = stream.getvalue().count("\n")
            display.update(
                JobProgress(metrics.num_completed, len(lengths), metrics, engine, 0, MAX_TOKENS)
            )
            if stream.getvalue().count("\n") > num_lines:
                eta = re.search(r"ETA (\d+):(\d\d):(\d\d)", stream.getvalue().splitlines()[-1])
                if eta is not None:
                    hours, minutes, seconds = map(int, eta.groups())
                    shown.append((end - now, hours * 3600 + minutes * 60 + seconds))
    assert len(shown) > 10
    return shown


def assert_never_grows(shown: list[tuple[float, int]]) -> None:
    for (_, before), (_, after) in zip(shown, shown[1:]):
        assert after <= before + 5, shown


LATE = [MAX_TOKENS] * 3


@pytest.mark.parametrize(
    "lengths",
    [
        [20] + [MAX_TOKENS] * 11,  # the README demo as the issue saw it: 3:34, then 11:37, of 3:52
        [15, 40, 55, 70, 90, 110, 130, 150, 180, *LATE],
    ],
)
def test_eta_of_a_few_requests_running_to_max_tokens(monkeypatch, lengths):
    shown = shown_etas(monkeypatch, lengths, max_num_seqs=256, step_s=0.9)
    for left, eta in shown:
        assert abs(eta - left) <= 0.1 * left + 5, shown
    assert_never_grows(shown)


def test_eta_of_a_few_requests_stopping_early_is_an_upper_bound(monkeypatch):
    lengths = [15, 40, 55, 70, 90, 110, 130, 150, 180, 190, 200, 210]
    shown = shown_etas(monkeypatch, lengths, max_num_seqs=256, step_s=0.9)
    for left, eta in shown:
        assert left - 5 <= eta <= left + (MAX_TOKENS - 150) * 0.9 + 5, shown
    assert_never_grows(shown)


def test_eta_of_a_long_batch_converges(monkeypatch):
    rng = random.Random(0)
    lengths = [rng.randint(8, MAX_TOKENS) for _ in range(400)]
    shown = shown_etas(monkeypatch, lengths, max_num_seqs=32, step_s=0.05)
    total = shown[0][0]
    for left, eta in shown:
        if left < 0.8 * total:  # past the first fifth of the run
            assert abs(eta - left) <= 0.4 * left + 5, shown


def test_status_shows_the_drafts_accepted_once_any_were_verified():
    display = RunProgress(Console(file=io.StringIO()), enabled=True)
    stats, metrics = EngineStats(), RunMetrics(start=0.0)
    engine = SimpleNamespace(stats=stats, num_unfinished_requests=1)
    display.samples.append((1.0, 0, 0))
    progress = JobProgress(0, 1, metrics, engine, 0, MAX_TOKENS)
    assert "drafts" not in display.status_lines(progress)[1]
    stats.spec_decode.record(4, 3)
    assert display.status_lines(progress)[1].endswith("drafts accepted 75%")


def test_a_pooling_jobs_eta_is_its_requests_left_at_the_recent_pace(monkeypatch):
    """An embedding job makes no output tokens: 3 requests end every 0.5 s step, and the ETA
    shown is the time actually left; its status line shows no generation rate."""
    clock = SimpleNamespace(now=0.0)
    monkeypatch.setattr(progress_module.time, "perf_counter", lambda: clock.now)
    stream, total, shown = io.StringIO(), 300, []
    stats, metrics = EngineStats(), RunMetrics(start=0.0)
    engine = SimpleNamespace(stats=stats, num_unfinished_requests=0, pooler_config=object())
    with RunProgress(Console(file=stream, width=300), enabled=True) as display:
        display.last_log = 0.0
        while metrics.num_completed < total:
            clock.now += 0.5
            stats.num_steps += 1
            stats.num_prompt_tokens += 300
            metrics.num_completed += 3
            num_lines = stream.getvalue().count("\n")
            display.update(JobProgress(metrics.num_completed, total, metrics, engine, 0, None))
            if stream.getvalue().count("\n") > num_lines:
                line = stream.getvalue().splitlines()[-1]
                assert "gen " not in line and "prompt 600 tok/s" in line
                eta = re.search(r"ETA (\d+):(\d\d):(\d\d)", line)
                if eta is not None:
                    hours, minutes, seconds = map(int, eta.groups())
                    left = (total - metrics.num_completed) / 3 * 0.5
                    shown.append((left, hours * 3600 + minutes * 60 + seconds))
    assert len(shown) > 5
    assert all(abs(eta - left) <= 1 for left, eta in shown), shown
