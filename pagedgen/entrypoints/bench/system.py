import os
import platform
import time
from typing import NamedTuple

import torch


class CpuSample(NamedTuple):
    """Machine-wide CPU time from /proc/stat (seconds) and this process's own CPU time."""

    wall: float
    busy: float  # user + nice + system + irq + softirq, all cores
    steal: float
    total: float  # every field but guest time, which user time already counts
    own: float  # this process: user + system


def sample_cpu() -> CpuSample:
    ticks = os.sysconf("SC_CLK_TCK")
    busy = steal = total = 0.0
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        user, nice, system, idle, iowait, irq, softirq, steal_ticks = (fields + [0] * 8)[:8]
        busy = (user + nice + system + irq + softirq) / ticks
        steal = steal_ticks / ticks
        total = (user + nice + system + idle + iowait + irq + softirq + steal_ticks) / ticks
    except (OSError, ValueError):
        pass  # not Linux: the shares below read 0
    own = sum(os.times()[:2])
    return CpuSample(time.perf_counter(), busy, steal, total, own)


def load_average() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


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


def machine_state(since: CpuSample | None = None) -> dict:
    """Load average and CPU steal: since boot, or since the sample `since` when given."""
    now = sample_cpu()
    base = since or CpuSample(0.0, 0.0, 0.0, 0.0, 0.0)
    return {"loadavg": load_average(), **cpu_shares(base, now)}


def machine_info(num_threads: int) -> dict:
    from pagedgen.kernels.cpu_features import isa_name

    return {
        "cpu": _cpu_model(),
        "isa": isa_name(),
        "num_cpus": os.cpu_count(),
        "num_threads": num_threads,
        "torch": torch.__version__,
        "python": platform.python_version(),
    }


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"
