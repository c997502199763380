"""The worker's CPU threads: torch's intra-op threads, which our C kernels use too."""

import functools

import torch

from pagedgen.cpu_load import cpu_budget


@functools.cache
def default_num_threads() -> int:
    """torch's own thread count (one per physical core), read before this module sets any."""
    return torch.get_num_threads()


_fitted: list[int] = []  # the count fit_num_threads last chose itself


def fit_num_threads(num_threads: int | None) -> tuple[int, str | None]:
    """Sets the process's thread count: num_threads where given, or the count the caller gave
    torch.set_num_threads, else one thread per CPU that other processes leave free, up to
    torch's default. Returns it, and a line to say where others keep the machine busy: threads
    that share a core with another process make every parallel region wait for the slowest
    (3x slower on 2 cores with one taken, against 1.3x with a thread fewer)."""
    default, current = default_num_threads(), torch.get_num_threads()
    if num_threads is None and current != default and current not in _fitted[-1:]:
        return current, None  # torch.set_num_threads(n) before the engine: the caller's choice
    note = None
    if num_threads is None:
        budget = cpu_budget()
        num_threads = min(default, budget.num_threads)
        if budget.busy:
            note = (
                f"{budget.describe()}: running {num_threads} thread"
                f"{'s' if num_threads > 1 else ''} (--num-threads N to choose)"
            )
        _fitted[:] = [num_threads]
    if torch.get_num_threads() != num_threads:
        torch.set_num_threads(num_threads)
    return num_threads, note
