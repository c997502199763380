"""Where a CPU decode step's time goes, for bench's cpu_decode_parts: a window of steady decode
steps of a full batch (profile_steps.run_window) split into the parts of the model forward, each
against its own bound.

- each role of Linear layer across layers (the module name's last component: qkv_proj, o_proj,
  gate_up_proj, down_proj, lm_head): its weights, as packed, stream once a call, and its rows
  cost 2 x in x out FLOPs each; its bound is max(bytes / copy bandwidth, FLOPs / matmul peak);
- attention (the Attention modules' forward and forward_qkv): every context token's K/V read
  once, against the copy bandwidth;
- other: the rest of the model's forward (embedding, norms, rotary, activation, residual adds);
- outside: the rest of the step (scheduling, inputs, sampling less lm_head, host bookkeeping).

The bandwidth and peak are the roofline's. Parts are timed with time.perf_counter around module
hooks (a CPU runs each op synchronously); a nested part's time counts in it only. Hooks do not
fire in a graph replay, so a timed step runs eagerly, the runner's graphs set aside. The window's
steps take turns: one timed so, the next as it runs normally (graphs, no hooks: the plain step),
so that both kinds see the same load on a shared machine.
"""

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from rich.table import Table
from torch import nn

from pagedgen.attention.layer import Attention
from pagedgen.entrypoints.bench.profile_steps import run_window
from pagedgen.entrypoints.bench.roofline import Roofline
from pagedgen.entrypoints.bench.workloads import Workload
from pagedgen.entrypoints.llm import LLM
from pagedgen.entrypoints.tables import figures_table
from pagedgen.layers.linear import Linear

MAX_NUM_STEPS = 16  # after one warm-up step: half timed by part, half plain
ATTENTION, OTHER, OUTSIDE = "attention", "other", "outside"


@dataclass(slots=True)
class Calls:
    """One part's calls in one step."""

    seconds: float = 0.0  # exclusive of nested parts
    num_calls: int = 0
    rows: int = 0
    bytes: float = 0.0  # weights streamed
    flops: float = 0.0


class PartTimer:
    """Exclusive time per part, step by step: enter() at a part's start, leave() at its end;
    a part left inside another is subtracted from it. A plain step (new_step(timed=False)) is
    None in steps, and its parts are not timed."""

    def __init__(self) -> None:
        self.steps: list[dict[str, Calls] | None] = []
        self._stack: list[list[float]] = []  # [start, nested parts' time] per open part

    @property
    def timing(self) -> bool:
        return bool(self.steps) and self.steps[-1] is not None

    def new_step(self, timed: bool) -> None:
        self.steps.append({} if timed else None)

    def enter(self) -> None:
        self._stack.append([time.perf_counter(), 0.0])

    def leave(self, part: str, rows: int = 0, num_bytes: float = 0.0, flops: float = 0.0) -> None:
        start, nested = self._stack.pop()
        elapsed = time.perf_counter() - start
        if self._stack:
            self._stack[-1][1] += elapsed
        calls = self.steps[-1].setdefault(part, Calls())
        calls.seconds += elapsed - nested
        calls.num_calls += 1
        calls.rows += rows
        calls.bytes += num_bytes
        calls.flops += flops


def linear_roles(model: nn.Module) -> dict[str, list[nn.Module]]:
    """The model's Linear layers (pagedgen's and torch's) by the last component of their name."""
    roles: dict[str, list[nn.Module]] = {}
    for name, module in model.named_modules():
        if isinstance(module, Linear | nn.Linear):
            roles.setdefault(name.rsplit(".", 1)[-1], []).append(module)
    return roles


def held_bytes(module: nn.Module) -> int:
    """The bytes a layer holds, as packed (weight and bias; a tied weight counted in each)."""
    return sum(p.numel() * p.element_size() for p in module.parameters())


@contextmanager
def timed_parts(llm: LLM, timer: PartTimer) -> Iterator[None]:
    """Times the parts of every other engine step into timer while open, from the first, the
    runner's graphs set aside in those; leaves the engine, its runner and model as they were."""
    engine, runner = llm.engine, llm.engine.runner
    model = runner.model
    graphs = runner.decode_graphs, runner.lora_decode_graphs, runner.piecewise_graphs
    handles = []
    attention = [m for m in model.modules() if isinstance(m, Attention)]
    step = engine.step

    def timed_step(*args: Any, **kwargs: Any) -> Any:
        timed = len(timer.steps) % 2 == 0
        timer.new_step(timed)
        runner.decode_graphs, runner.lora_decode_graphs, runner.piecewise_graphs = (
            (None, None, None) if timed else graphs
        )
        return step(*args, **kwargs)

    def hooks(module: nn.Module, part: str, cost: Callable[[tuple], tuple] | None) -> None:
        measured: list[tuple] = []

        def pre(module: nn.Module, args: tuple, kwargs: dict) -> None:
            if timer.timing:  # the lm_head of a plain step runs outside its graph
                measured.append(cost(args or tuple(kwargs.values())) if cost else ())
                timer.enter()

        def post(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
            if timer.timing:
                timer.leave(part, *measured.pop())

        handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(module.register_forward_hook(post, with_kwargs=True, always_call=True))

    def linear_cost(module: nn.Module) -> Callable[[tuple], tuple]:
        num_bytes, in_out = held_bytes(module), module.in_features * module.out_features

        def cost(args: tuple) -> tuple:
            x = args[0]
            rows = x.numel() // x.shape[-1]
            return rows, num_bytes, 2.0 * rows * in_out

        return cost

    def timed_attention(fn: Callable) -> Callable:
        def timed(*args: Any, **kwargs: Any) -> Any:
            if not timer.timing:
                return fn(*args, **kwargs)
            timer.enter()
            try:
                return fn(*args, **kwargs)
            finally:
                timer.leave(ATTENTION)

        return timed

    try:
        engine.step = timed_step
        hooks(model, OTHER, None)
        for role, modules in linear_roles(model).items():
            for module in modules:
                hooks(module, role, linear_cost(module))
        for module in attention:  # models call these directly: no module hook fires
            module.forward = timed_attention(module.forward)
            module.forward_qkv = timed_attention(module.forward_qkv)
        yield
    finally:
        for handle in handles:
            handle.remove()
        for module in attention:
            for name in ("forward", "forward_qkv"):
                vars(module).pop(name, None)
        vars(engine).pop("step", None)
        runner.decode_graphs, runner.lora_decode_graphs, runner.piecewise_graphs = graphs


def cpu_decode_parts(
    llm: LLM, workload: Workload, roofline: Roofline | None, max_num_steps: int = MAX_NUM_STEPS
) -> dict | None:
    """The parts of the steady decode steps of the workload's first max_num_seqs requests (see
    the module docstring), per step; bounds against the roofline's copy bandwidth and matmul
    peak (none without a roofline). None off the CPU."""
    runner = llm.engine.runner
    if runner.device.type != "cpu":
        return None
    num_requests = min(workload.num_requests, llm.engine.scheduler.max_num_seqs)
    timer = PartTimer()
    window = run_window(
        llm,
        workload,
        num_requests,
        max_num_steps,
        "decode",
        traced=False,
        around=timed_parts(llm, timer),
    )
    timed = [k for k, i in enumerate(window.steps) if timer.steps[i] is not None]
    plain_s = [seconds for k, seconds in enumerate(window.step_s) if k not in timed]
    num_steps, kv_tokens = len(timed), sum(window.step_kv_tokens[k] for k in timed)
    report: dict = {
        "num_steps": num_steps,
        "num_plain_steps": len(plain_s),
        "num_seqs": window.num_tokens / len(window.steps) if window.steps else 0,
        "context_tokens": kv_tokens / num_steps if num_steps else 0,
        "copy_gbps": roofline.copy_gbps if roofline else None,
        "peak_gflops": roofline.peak_gflops if roofline else None,
        "parts": {},
    }
    if not num_steps:
        return report
    totals: dict[str, Calls] = {}
    for k in timed:
        for part, calls in timer.steps[window.steps[k]].items():
            total = totals.setdefault(part, Calls())
            total.seconds += calls.seconds
            total.num_calls += calls.num_calls
            total.rows += calls.rows
            total.bytes += calls.bytes
            total.flops += calls.flops
    window_s = sum(window.step_s[k] for k in timed)
    timed_s = sum(calls.seconds for calls in totals.values())
    bytes_per_s = roofline.copy_gbps * 1e9 if roofline else None
    flops_per_s = roofline.peak_gflops * 1e9 if roofline else None

    def figures(seconds: float, num_bytes: float | None, flops: float | None = None) -> dict:
        bound_s = bound_by = None
        if bytes_per_s and num_bytes is not None:
            bytes_s, flops_s = num_bytes / bytes_per_s, (flops or 0.0) / flops_per_s
            bound_s, bound_by = max(bytes_s, flops_s), "FLOPs" if flops_s > bytes_s else "bytes"
        return {
            "ms": 1000 * seconds / num_steps,
            "step_perc": 100 * seconds / window_s,
            "gb": None if num_bytes is None else num_bytes / num_steps / 1e9,
            "gflop": None if flops is None else flops / num_steps / 1e9,
            "gbps": None if num_bytes is None or not seconds else num_bytes / seconds / 1e9,
            "gflops": None if flops is None or not seconds else flops / seconds / 1e9,
            "bound_ms": None if bound_s is None else 1000 * bound_s / num_steps,
            "bound_perc": None if bound_s is None or not seconds else 100 * bound_s / seconds,
            "bound_by": bound_by,  # which of the two the bound is
        }

    parts = report["parts"]
    for role, modules in linear_roles(runner.model).items():
        calls = totals.get(role, Calls())
        parts[role] = {
            "kind": "linear",
            "num_layers": len(modules),
            "weight_bytes": sum(held_bytes(m) for m in modules),
            "rows": calls.rows / calls.num_calls if calls.num_calls else 0,
            "calls_per_step": calls.num_calls / num_steps,
            **figures(calls.seconds, calls.bytes, calls.flops),
        }
    kv_bytes = kv_tokens * runner.geometry.bytes_per_token
    attention_s = totals.get(ATTENTION, Calls()).seconds
    parts[ATTENTION] = {"kind": "attention", **figures(attention_s, kv_bytes)}
    parts[OTHER] = {"kind": "other", **figures(totals.get(OTHER, Calls()).seconds, None)}
    parts[OUTSIDE] = {"kind": "outside", **figures(window_s - timed_s, None)}
    # the step's bound: its parts' bounds one after the other
    bound_ms = sum(p["bound_ms"] for p in parts.values() if p["bound_ms"]) if roofline else None
    report["step"] = _step(1000 * window_s / num_steps, bound_ms)
    report["step"]["gb"] = sum(p["gb"] for p in parts.values() if p["gb"])
    report["plain_step"] = _step(1000 * sum(plain_s) / len(plain_s), bound_ms) if plain_s else None
    return report


def _step(ms: float, bound_ms: float | None) -> dict:
    return {
        "ms": ms,
        "bound_ms": bound_ms,
        "bound_perc": None if bound_ms is None else 100 * bound_ms / ms,
    }


def decode_parts_table(parts: dict) -> Table:
    """The report's cpu_decode_parts, a row per part, then the step timed with the hooks and
    without them (graphs on), in 80 columns."""
    table = figures_table(
        f"CPU decode step by part ({parts['num_steps']} steps, {parts['num_plain_steps']} plain; "
        f"{parts['num_seqs']:.0f} seqs, {parts['context_tokens']:,.0f} context tokens)"
    )
    for column in (
        "part",
        "MB read\n/step",
        "rows",
        "GFLOP\n/step",
        "ms\n/step",
        "GB/s",
        "GFLOP/s",
        "% of\nbound",
        "bound\nby",
        "% of\nstep",
    ):
        table.add_column(column, justify="left" if column == "part" else "right")

    def number(value: float | None, spec: str) -> str:
        return "" if value is None else format(value, spec)

    def add(label: str, row: dict) -> None:
        table.add_row(
            label,
            number(None if row.get("gb") is None else 1000 * row["gb"], ",.1f"),
            number(row.get("rows"), ".0f"),
            number(row.get("gflop"), ",.1f"),
            number(row["ms"], ",.2f"),
            number(row.get("gbps"), ",.1f"),
            number(row.get("gflops"), ",.0f"),
            number(row.get("bound_perc"), ".1f"),
            row.get("bound_by") or "",
            number(row.get("step_perc"), ".1f"),
        )

    labels = {OTHER: "other forward", OUTSIDE: "outside fwd"}
    for name, row in parts["parts"].items():
        add(labels.get(name, name), row)
    if "step" in parts:
        add("step (hooks)", {**parts["step"], "step_perc": 100.0})
    if parts.get("plain_step"):
        add("step (plain)", parts["plain_step"])
    return table
