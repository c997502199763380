import os
import platform

import torch

from pagedgen.cpu_load import CpuSample, cpu_shares, sample_cpu


def load_average() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


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
