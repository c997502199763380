"""What CPU a run really has: other processes' use of its CPUs, and the threads it runs."""

import subprocess
import sys
import time

import pytest
import torch

from pagedgen import cpu_load
from pagedgen.cpu_load import CpuBudget, CpuSample, cpu_budget, others_busy
from pagedgen.worker import cpu_threads


def test_threads_follow_the_cpus_others_leave_free():
    assert CpuBudget(2, 0.0).num_threads == 2 and not CpuBudget(2, 0.3).busy
    assert CpuBudget(2, 1.0).num_threads == 1 and CpuBudget(2, 1.0).busy
    assert CpuBudget(2, 2.0).num_threads == 1  # at least one
    assert CpuBudget(16, 3.4).num_threads == 13
    assert "1.0 of the 2 CPUs" in CpuBudget(2, 1.0).describe()


def test_others_busy_is_the_machine_s_time_less_this_process_s():
    start = CpuSample(wall=10.0, busy=100.0, steal=0.0, total=200.0, own=5.0)
    end = CpuSample(wall=12.0, busy=104.0, steal=0.0, total=204.0, own=7.0)
    assert others_busy(start, end) == pytest.approx(1.0)  # 4 CPU-seconds, 2 of them ours


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/stat")
def test_a_spinning_process_is_seen():
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        budget = cpu_budget(0.5)
    finally:
        spinner.kill()
    assert budget.others_busy >= 0.7, budget


def test_a_busy_machine_runs_fewer_threads_and_says_so(monkeypatch):
    before = torch.get_num_threads()
    try:
        monkeypatch.setattr(cpu_threads, "default_num_threads", lambda: 2)
        monkeypatch.setattr(cpu_threads, "_fitted", [])
        torch.set_num_threads(2)
        monkeypatch.setattr(cpu_threads, "cpu_budget", lambda: CpuBudget(2, 1.1))
        threads, note = cpu_threads.fit_num_threads(None)
        assert threads == torch.get_num_threads() == 1
        assert "running 1 thread (--num-threads N" in note
        monkeypatch.setattr(cpu_threads, "cpu_budget", lambda: CpuBudget(2, 0.1))
        assert cpu_threads.fit_num_threads(None) == (2, None)
        monkeypatch.setattr(cpu_threads, "cpu_budget", lambda: CpuBudget(2, 2.0))
        assert cpu_threads.fit_num_threads(2) == (2, None)  # asked for: kept, unsaid
    finally:
        torch.set_num_threads(before)


def test_a_cgroup_quota_below_the_cpus_is_the_budget(monkeypatch):
    monkeypatch.setattr(cpu_load, "allowed_cpus", lambda: frozenset(range(8)))
    monkeypatch.setattr(cpu_load, "cpu_quota", lambda: 2.5)
    assert cpu_budget() == CpuBudget(2, 0.0)


def test_a_count_the_caller_set_is_kept(monkeypatch):
    before = torch.get_num_threads()
    try:
        monkeypatch.setattr(cpu_threads, "default_num_threads", lambda: 2)
        monkeypatch.setattr(cpu_threads, "cpu_budget", lambda: CpuBudget(2, 0.0))
        monkeypatch.setattr(cpu_threads, "_fitted", [])
        torch.set_num_threads(1)  # as a script may before LLM()
        assert cpu_threads.fit_num_threads(None) == (1, None)
    finally:
        torch.set_num_threads(before)


def test_a_fresh_mark_is_the_window_and_an_old_one_is_not(monkeypatch):
    slept: list[float] = []
    monkeypatch.setattr(cpu_load.time, "sleep", slept.append)
    monkeypatch.setattr(cpu_load, "cpu_quota", lambda: None)
    monkeypatch.setattr(cpu_load, "_mark", [])
    cpu_budget(0.1)
    assert slept == [0.1]  # no mark: a window of its own
    now = time.perf_counter()
    monkeypatch.setattr(cpu_load, "_mark", [CpuSample(now - 2.0, 0.0, 0.0, 0.0, 0.0)])
    cpu_budget(0.1)
    assert slept == [0.1]  # marked 2 s ago: that window, no sleep
    monkeypatch.setattr(cpu_load, "_mark", [CpuSample(now - 100.0, 0.0, 0.0, 0.0, 0.0)])
    cpu_budget(0.1)
    assert slept == [0.1, 0.1]  # too old: the machine now
