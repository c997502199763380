"""How well the paged KV cache is used: a real run or a simulation of the real scheduler with
token lengths only, beside contiguous allocation, over block sizes."""

from pagedgen.entrypoints.profile.profiler import (
    ProfileReport,
    build_workload,
    profile_real,
    profile_simulated,
)
from pagedgen.entrypoints.profile.simulate import PoolShape, SimRequest, simulate

__all__ = [
    "PoolShape",
    "ProfileReport",
    "SimRequest",
    "build_workload",
    "profile_real",
    "profile_simulated",
    "simulate",
]
