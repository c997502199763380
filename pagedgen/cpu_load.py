"""How much CPU this process can have: the CPUs it may run on, and how busy other processes
keep them (/proc/stat, user-visible jiffies). An engine that runs one OpenMP thread per CPU
while another process holds one of them waits at every parallel region for the thread that
shares its core: on 2 cores, 3x slower. So the engine runs one thread per CPU left free."""

import math
import os
import time
from typing import NamedTuple

BUSY_CPUS = 0.5  # others' use, in CPUs, from which a machine counts as busy
SAMPLE_SECONDS = 0.1
MAX_MARK_AGE_S = 30.0  # a mark older than this is no longer the machine's present state


class CpuSample(NamedTuple):
    """CPU time (seconds, summed over the CPUs sampled) at one moment, and this process's own."""

    wall: float
    busy: float  # user + nice + system + irq + softirq
    steal: float
    total: float  # every field but guest time, which user time already counts
    own: float  # this process: user + system


def allowed_cpus() -> frozenset[int]:
    """The CPUs this process may run on."""
    try:
        return frozenset(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return frozenset(range(os.cpu_count() or 1))


def cpu_quota() -> float | None:
    """The cgroup v2 CPU limit, in CPUs (a container's --cpus), or None without one."""
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()[:2]
    except (OSError, ValueError):
        return None
    return None if quota == "max" else int(quota) / int(period)


def sample_cpu(cpus: frozenset[int] | None = None) -> CpuSample:
    """CPU time now, over cpus (default: all of the machine's)."""
    ticks = os.sysconf("SC_CLK_TCK")
    wanted = {"cpu"} if cpus is None else {f"cpu{c}" for c in cpus}
    busy = steal = total = 0.0
    try:
        with open("/proc/stat") as f:
            for line in f:
                name, *values = line.split()
                if not name.startswith("cpu"):
                    break
                if name not in wanted:
                    continue
                fields = [int(x) for x in values]
                user, nice, system, idle, iowait, irq, softirq, steal_t = (fields + [0] * 8)[:8]
                busy += (user + nice + system + irq + softirq) / ticks
                steal += steal_t / ticks
                total += (user + nice + system + idle + iowait + irq + softirq + steal_t) / ticks
    except (OSError, ValueError):
        pass  # not Linux: the shares below read 0
    return CpuSample(time.perf_counter(), busy, steal, total, sum(os.times()[:2]))


def others_busy(start: CpuSample, end: CpuSample) -> float:
    """Other processes' busy time between two samples, in CPUs (1.0: one CPU kept busy)."""
    wall = end.wall - start.wall
    if wall <= 0:
        return 0.0
    return max((end.busy - start.busy) - (end.own - start.own), 0.0) / wall


def cpu_shares(start: CpuSample, end: CpuSample) -> dict[str, float]:
    """Between two samples: steal and other processes' busy time, as % of all cores' time."""
    total = end.total - start.total
    if total <= 0:
        return {"steal_perc": 0.0, "others_busy_perc": 0.0}
    others = (end.busy - start.busy) - (end.own - start.own)
    return {
        "steal_perc": round(100 * (end.steal - start.steal) / total, 2),
        "others_busy_perc": round(100 * max(others, 0.0) / total, 2),
    }


class CpuBudget(NamedTuple):
    """The CPUs this process may use, how many of them other processes keep busy, and so the
    threads it should run."""

    num_cpus: int
    others_busy: float  # in CPUs

    @property
    def busy(self) -> bool:
        return self.others_busy >= BUSY_CPUS

    @property
    def num_threads(self) -> int:
        """One per CPU that others leave free (at least one)."""
        return max(1, self.num_cpus - round(self.others_busy))

    def describe(self) -> str:
        busy = f"{self.others_busy:.1f} of the {self.num_cpus} CPUs"
        return f"other processes keep {busy} this process may use busy"


_mark: list[CpuSample] = []  # mark_start()'s sample


def mark_start() -> None:
    """Starts the window cpu_budget measures over (a command line does, as it starts: the
    seconds of its imports and checks then serve, and no sleep)."""
    _mark[:] = [sample_cpu(allowed_cpus())]


def cpu_budget(seconds: float = SAMPLE_SECONDS) -> CpuBudget:
    """Measured since mark_start() where that is between `seconds` and MAX_MARK_AGE_S ago, else
    over `seconds` from now. Under a cgroup quota smaller than the CPUs it may run on, others'
    use of those CPUs says nothing of its own share: it counts as none."""
    cpus = allowed_cpus()
    quota = cpu_quota()
    if quota is not None and quota < len(cpus):
        return CpuBudget(max(1, math.floor(quota)), 0.0)
    start = _mark[0] if _mark else None
    age = time.perf_counter() - start.wall if start is not None else None
    if age is None or not seconds <= age <= MAX_MARK_AGE_S:
        start = sample_cpu(cpus)
        time.sleep(seconds)
    return CpuBudget(len(cpus), min(others_busy(start, sample_cpu(cpus)), len(cpus)))
