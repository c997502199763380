from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from transformers import PreTrainedModel

from pagedgen.config import EngineConfig
from pagedgen.cpu_load import sample_cpu
from pagedgen.engine.llm_engine import log_to_stderr
from pagedgen.engine.model_setup import pick_device, pick_dtype
from pagedgen.entrypoints.batch.requests import vocab_size_of
from pagedgen.entrypoints.bench import engines, latency, vllm_baseline
from pagedgen.entrypoints.bench.cpu_decode_parts import cpu_decode_parts
from pagedgen.entrypoints.bench.decode_bound import llm_decode_bound
from pagedgen.entrypoints.bench.gpu_memory import bench_gpu_memory_utilization
from pagedgen.entrypoints.bench.overhead import profile_engine, step_timers_synchronize
from pagedgen.entrypoints.bench.profile_steps import profile_decode_steps, profile_mixed_steps
from pagedgen.entrypoints.bench.result import RunResult, agreement, ratios
from pagedgen.entrypoints.bench.roofline import Roofline, measure_roofline
from pagedgen.entrypoints.bench.system import machine_info, machine_state
from pagedgen.entrypoints.bench.workload_file import (
    check_workload,
    is_workload_file,
    read_workload,
    save_workload,
)
from pagedgen.entrypoints.bench.workloads import Workload, random_workload, sharegpt_workload
from pagedgen.entrypoints.llm import LLM
from pagedgen.loader.resolve import ResolvedModel, resolve_model

WORKLOADS = ("sharegpt", "fixed", "latency")
LATENCY_OUTPUT_LEN = 64


@dataclass(slots=True)
class BenchOptions:
    """One `pagedgen bench` run: a workload, the engines to compare and pagedgen's engine.

    workload is sharegpt, fixed, latency or a workload file (see workload_file.py);
    save_workload names a file to write the workload to, whichever it is. The baselines run
    the engine's model, dtype and device; seed seeds the random prompts and the engine.
    """

    engine: EngineConfig = field(default_factory=EngineConfig)
    workload: str = "sharegpt"
    num_prompts: int = 64
    input_len: int = 128
    output_len: int | None = None  # fixed: 128, latency: 64
    baselines: list[str] = field(default_factory=lambda: ["static32", "static64"])
    num_iters: int = 1  # timed passes per engine, round robin; the fastest is kept
    roofline: bool = True
    overhead: bool = True
    gpu_profile: bool = True  # on cuda only: profile_decode_steps after the timed passes
    gpu_profile_steps: int = 32
    decode_parts: bool = True  # on a CPU: cpu_decode_parts after the timed passes
    generate_batch_timeout: float = 600.0
    seed: int = 0
    save_workload: str | None = None

    def __post_init__(self) -> None:
        if self.workload not in WORKLOADS and not is_workload_file(self.workload):
            raise ValueError(
                f"workload must be one of {WORKLOADS} or a workload .json file, "
                f"got {self.workload!r}"
            )
        unknown = sorted(set(self.baselines) - set(engines.BASELINES))
        if unknown:
            raise ValueError(f"unknown baselines {unknown}; known: {list(engines.BASELINES)}")
        for name in ("num_prompts", "input_len", "num_iters", "gpu_profile_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.output_len is not None and self.output_len < 1:
            raise ValueError(f"output_len must be >= 1, got {self.output_len}")
        if self.save_workload and not Path(self.save_workload).expanduser().parent.is_dir():
            raise ValueError(f"cannot save the workload to {self.save_workload}: no such folder")


def bench_dtype(engine: EngineConfig) -> torch.dtype:
    """The dtype both pagedgen and the baselines run: the engine's, "auto" resolved."""
    device = pick_device("auto") if engine.device == "auto" else torch.device(engine.device)
    return pick_dtype(engine.dtype, device)


def run_bench(options: BenchOptions, log: Callable[[str], None] = log_to_stderr) -> dict:
    """Runs pagedgen and the baselines on one workload in this process; returns every figure."""
    if options.engine.num_threads is not None:
        torch.set_num_threads(options.engine.num_threads)
    start_state, start = machine_state(), sample_cpu()
    from_file = read_workload(options.workload) if options.workload not in WORKLOADS else None
    resolved = resolve_model(
        options.engine.model, options.engine.download_dir, options.engine.revision
    )
    dtype = bench_dtype(options.engine)
    gpu_memory_utilization = _gpu_memory_utilization(options, resolved, log)
    engine_args = asdict(options.engine) | dict(
        dtype=str(dtype).removeprefix("torch."),
        gpu_memory_utilization=gpu_memory_utilization,
        seed=options.seed,
    )
    llm = LLM(log=log, **engine_args)
    engine = llm.engine
    if from_file is not None:
        check_workload(from_file, vocab_size_of(engine), engine.max_model_len)
        workload = from_file
    else:
        workload = _workload(options, llm)
    log(f"workload {workload.name}: {workload.describe()}")
    if options.save_workload:
        save_workload(workload, options.save_workload)
        log(f"workload saved to {options.save_workload}")
    model = None
    if set(options.baselines) & set(engines.TRANSFORMERS_BASELINES):
        log(f"loading {resolved.path} into transformers for the baselines")
        model = engines.load_hf_model(resolved, dtype, str(engine.runner.device))
    tokenizer = llm.tokenizer
    pad_token_id = next(
        (i for i in (tokenizer.pad_token_id, tokenizer.eos_token_id) if i is not None), 0
    )
    roofline = None
    if options.roofline:
        log("measuring the roofline")
        config = engine.hf_config
        roofline = measure_roofline(
            engine.runner.model,
            config.hidden_size,
            getattr(config, "intermediate_size", None) or 4 * config.hidden_size,  # GPT-2's
            config.vocab_size,
            dtype,
        )
    engines.warm_up(llm, model, pad_token_id)
    report: dict = {
        "model": options.engine.model,
        "options": asdict(options),
        "machine": machine_info(torch.get_num_threads()),
        "machine_start": start_state,
        "workload": workload.describe(),
        "engine": {
            "max_num_seqs": engine.scheduler.max_num_seqs,
            "max_num_batched_tokens": engine.scheduler.max_num_batched_tokens,
            "block_size": engine.config.block_size,
            "num_blocks": engine.num_blocks,
            "dtype": str(dtype).removeprefix("torch."),
            "kv_cache_dtype": str(engine.runner.kv_cache_dtype).removeprefix("torch."),
            "gpu_memory_utilization": gpu_memory_utilization,
            "decode_graphs": graphs.describe() if (graphs := engine.runner.decode_graphs) else None,
        },
        "roofline": roofline.to_dict() if roofline else None,
    }
    if options.workload == "latency":
        if "vllm" in options.baselines:
            log("vllm baseline skipped: it runs the throughput workloads (sharegpt, fixed) only")
        report["latency"] = latency.latency_runs(
            llm, model, workload, pad_token_id, roofline, options.baselines, options.num_iters
        )
    else:
        report.update(
            _throughput_runs(options, llm, model, workload, pad_token_id, roofline, resolved, log)
        )
    report["gpu_profile"] = report["gpu_profile_mixed"] = None
    if options.gpu_profile and engine.runner.device.type == "cuda":
        log(f"profiling pagedgen's decode and mixed steps (at most {options.gpu_profile_steps})")
        profiled = profile_decode_steps(llm, workload, options.gpu_profile_steps)
        report["gpu_profile"] = {**profiled.to_dict(), "bound": llm_decode_bound(llm, profiled)}
        mixed = profile_mixed_steps(llm, workload, options.gpu_profile_steps)
        report["gpu_profile_mixed"] = mixed.to_dict()
    report["cpu_decode_parts"] = None
    if options.decode_parts and engine.runner.device.type == "cpu":
        log("timing the parts of pagedgen's decode steps")
        report["cpu_decode_parts"] = cpu_decode_parts(llm, workload, roofline)
    report["machine_end"] = machine_state(since=start)
    return report


def _gpu_memory_utilization(
    options: BenchOptions, resolved: ResolvedModel, log: Callable[[str], None]
) -> float:
    """Room beside pagedgen for the baselines' weights (see gpu_memory)."""
    utilization, why = bench_gpu_memory_utilization(
        resolved.path, bench_dtype(options.engine), options.engine, options.baselines
    )
    if why is not None:
        log(why)
    return utilization


def _workload(options: BenchOptions, llm: LLM) -> Workload:
    tokenizer = llm.tokenizer
    if options.workload == "sharegpt":
        return sharegpt_workload(tokenizer, options.num_prompts)
    if options.workload == "fixed":
        output_len = options.output_len or 128
        return random_workload(
            tokenizer, options.num_prompts, options.input_len, output_len, options.seed
        )
    output_len = options.output_len or LATENCY_OUTPUT_LEN
    return random_workload(tokenizer, 1, options.input_len, output_len, options.seed, "latency")


def _throughput_runs(
    options: BenchOptions,
    llm: LLM,
    model: PreTrainedModel | None,
    workload: Workload,
    pad_token_id: int,
    roofline: Roofline | None,
    resolved: ResolvedModel,
    log: Callable[[str], None],
) -> dict:
    max_batch_tokens = llm.engine.scheduler.max_num_batched_tokens
    best: dict[str, RunResult] = {}
    overhead = None
    baselines = list(options.baselines)
    # Timers that synchronize (a GPU's) time a pass of their own, untimed; else the first pass.
    timed_profile = options.overhead and not step_timers_synchronize(llm.engine)
    for i in range(options.num_iters):
        profiling = timed_profile and i == 0
        with profile_engine(llm.engine) if profiling else nullcontext() as profiler:
            runs = [engines.run_pagedgen(llm, workload)]
        if profiler is not None:
            overhead = profiler.summary()
        for name in list(baselines):
            if name == "vllm":
                try:
                    runs.append(
                        vllm_baseline.run_vllm(
                            resolved.path,
                            workload,
                            str(bench_dtype(options.engine)).removeprefix("torch."),
                            options.engine.max_num_seqs,
                        )
                    )
                except vllm_baseline.VllmUnavailable as e:
                    log(f"vllm baseline skipped: {e}")
                    baselines.remove("vllm")
            elif name == "generate_batch":
                runs.append(
                    engines.run_generate_batch(
                        model,
                        workload,
                        max_batch_tokens,
                        options.engine.max_num_seqs,
                        timeout=options.generate_batch_timeout,
                    )
                )
            else:
                batch_size = int(name.removeprefix("static"))
                runs.append(engines.run_static(model, workload, batch_size, pad_token_id))
        for run in runs:
            if run.name not in best or run.output_tokens_per_s > best[run.name].output_tokens_per_s:
                best[run.name] = run
    if options.overhead and not timed_profile:
        with profile_engine(llm.engine) as profiler:
            engines.run_pagedgen(llm, workload)
        overhead = profiler.summary()
    ours = best["pagedgen"]
    figures = {}
    for name, run in best.items():
        figures[name] = run.figures()
        if roofline is not None:
            total = run.num_prompt_tokens + run.num_output_tokens
            figures[name]["matmul_peak_share"] = roofline.compute_share(total, run.elapsed)
            if run.num_steps:
                figures[name]["bandwidth_share"] = roofline.bandwidth_share(
                    run.num_steps, run.elapsed
                )
    return {
        "runs": figures,
        "ratios": {name: ratios(ours, run) for name, run in best.items() if run is not ours},
        "agreement": {
            name: agreement(ours.output_token_ids, run.output_token_ids)
            for name, run in best.items()
            if run is not ours and not run.note
        },
        "overhead": overhead,
    }
