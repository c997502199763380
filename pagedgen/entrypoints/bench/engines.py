import dataclasses
import inspect
import time
from math import ceil

import torch
from transformers import GenerationConfig, PreTrainedModel

from pagedgen.entrypoints.bench.result import RunResult, Timer
from pagedgen.entrypoints.bench.workloads import Workload
from pagedgen.entrypoints.llm import LLM
from pagedgen.loader.resolve import ResolvedModel
from pagedgen.sampling_params import SamplingParams

BASELINES = ("static32", "static64", "generate_batch", "vllm")
TRANSFORMERS_BASELINES = ("static32", "static64", "generate_batch")


def greedy_params(workload: Workload) -> list[SamplingParams]:
    return [
        SamplingParams(temperature=0, max_tokens=k, ignore_eos=True) for k in workload.max_tokens
    ]


def run_pagedgen(llm: LLM, workload: Workload) -> RunResult:
    stats = llm.engine.stats
    num_steps = stats.num_steps
    params = greedy_params(workload)
    if not llm.reset_prefix_cache():  # each pass computes its prompts, as the baselines do
        raise RuntimeError("requests are still running: the prefix cache cannot be reset")
    with Timer() as timer:
        outputs = llm.generate(workload.prompts, params, use_tqdm=False)
    errors = [out.error for out in outputs if out.error]
    if errors:
        raise RuntimeError(f"pagedgen failed {len(errors)} requests, e.g. {errors[0]}")
    token_ids = [out.outputs[0].token_ids for out in outputs]
    return _result("pagedgen", workload, timer, token_ids, stats.num_steps - num_steps)


def load_hf_model(resolved: ResolvedModel, dtype: torch.dtype, device: str) -> PreTrainedModel:
    """The transformers model the baselines run, with eos unset so that, as with ignore_eos,
    nothing stops before max_new_tokens."""
    from transformers import AutoModelForCausalLM

    from pagedgen.loader.resolve import transformers_files

    resolved = transformers_files(resolved)  # a converted GGUF's own file
    kwargs = {"gguf_file": resolved.gguf_file} if resolved.gguf_file else {}
    model = AutoModelForCausalLM.from_pretrained(resolved.path, dtype=dtype, **kwargs)
    model = model.to(device).eval()
    model.generation_config.eos_token_id = None
    return model


def run_static(
    model: PreTrainedModel, workload: Workload, batch_size: int, pad_token_id: int
) -> RunResult:
    """transformers' `generate` over fixed batches of batch_size requests in arrival order, left
    padded; a batch runs until its longest max_tokens and each output is then cut to its own."""
    token_ids: list[list[int]] = []
    num_steps = 0
    with Timer() as timer:
        for start in range(0, workload.num_requests, batch_size):
            prompts = workload.prompts[start : start + batch_size]
            max_tokens = workload.max_tokens[start : start + batch_size]
            outputs = static_generate(model, prompts, max(max_tokens), pad_token_id)
            token_ids += [row[:k] for row, k in zip(outputs, max_tokens)]
            num_steps += max(max_tokens)
    return _result(f"static{batch_size}", workload, timer, token_ids, num_steps)


@torch.inference_mode()
def static_generate(
    model: PreTrainedModel, prompts: list[list[int]], max_new_tokens: int, pad_token_id: int
) -> list[list[int]]:
    width = max(len(p) for p in prompts)
    input_ids = torch.tensor([[pad_token_id] * (width - len(p)) + p for p in prompts])
    attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    config = GenerationConfig(
        do_sample=False,
        max_new_tokens=max_new_tokens,
        min_new_tokens=None,
        eos_token_id=None,
        pad_token_id=pad_token_id,
    )
    out = model.generate(
        input_ids=input_ids.to(model.device),
        attention_mask=attention_mask.to(model.device),
        generation_config=config,
    )
    assert out.shape[1] == width + max_new_tokens, "generate stopped before max_new_tokens"
    return out[:, width:].tolist()


def run_generate_batch(
    model: PreTrainedModel,
    workload: Workload,
    max_batch_tokens: int,
    max_num_seqs: int,
    page_size: int = 256,
    timeout: float | None = None,
) -> RunResult:
    """transformers' continuous batching (the manager that `generate_batch` drives), each request
    with its own max_new_tokens. On a CPU the KV cache is sized explicitly to hold every request
    at once, since left alone it would take 60% of RAM; on a GPU it takes its default share of the
    memory free when it starts, as generate_batch's users get. A run past `timeout` seconds is
    stopped and measured over the requests that finished."""
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    lengths = [len(p) + k for p, k in zip(workload.prompts, workload.max_tokens)]
    on_gpu = model.device.type == "cuda"
    cb_config = ContinuousBatchingConfig(
        **{page_size_keyword(ContinuousBatchingConfig): page_size},
        num_blocks=None if on_gpu else sum(ceil(n / page_size) for n in lengths) + 1,
        max_batch_tokens=max(max_batch_tokens, max(len(p) for p in workload.prompts)),
        max_requests_per_batch=max_num_seqs,
    )
    config = GenerationConfig(do_sample=False, eos_token_id=-1, pad_token_id=0)
    results: dict[str, list[int]] = {}
    with (
        torch.inference_mode(),
        model.continuous_batching_context_manager(
            generation_config=config,
            continuous_batching_config=cb_config,
            block=True,
            timeout=5,
            warmup=False,
        ) as manager,
        Timer() as timer,
    ):
        deadline = time.perf_counter() + timeout if timeout else float("inf")
        for i, (prompt, k) in enumerate(zip(workload.prompts, workload.max_tokens)):
            manager.add_request(prompt, request_id=str(i), max_new_tokens=k, eos_token_id=-1)
        while len(results) < workload.num_requests and time.perf_counter() < deadline:
            result = manager.get_result(timeout=1)
            if result is not None and result.is_finished():
                if result.error is not None:
                    raise RuntimeError(
                        f"generate_batch failed request {result.request_id}: {result.error}"
                    )
                results[result.request_id] = list(result.generated_tokens)
            elif result is None and not manager.is_running():
                raise RuntimeError("transformers' continuous batching thread died")
    done = sorted(results, key=int)
    if not done:
        raise RuntimeError(f"generate_batch finished no request within {timeout} s")
    if len(done) < workload.num_requests:
        note = f"stopped at {timeout:.0f} s, {len(done)} of {workload.num_requests} requests done"
        workload = Workload(
            workload.name,
            [workload.prompts[int(i)] for i in done],
            [workload.max_tokens[int(i)] for i in done],
            workload.prompt_format,
        )
    else:
        note = ""
    result = _result("generate_batch", workload, timer, [results[i] for i in done], None)
    result.note = note
    return result


def page_size_keyword(config_class: type) -> str:
    """The keyword ContinuousBatchingConfig takes for its tokens per KV page: `page_size`, or
    `block_size` in the transformers versions that take no page_size. Read from the class itself,
    never from a version string."""
    if dataclasses.is_dataclass(config_class):
        names = {f.name for f in dataclasses.fields(config_class) if f.init}
    else:
        names = set(inspect.signature(config_class).parameters)
    for name in ("page_size", "block_size"):  # block_size lingers, deprecated, beside page_size
        if name in names:
            return name
    raise RuntimeError(
        f"{config_class.__qualname__} takes neither page_size nor block_size: this transformers "
        "version's continuous batching is not supported by the generate_batch baseline"
    )


def warm_up(llm: LLM, model: PreTrainedModel | None, pad_token_id: int) -> None:
    """One short request through each engine, so that lazy initialization is not timed."""
    prompt = list(range(1, 9))
    llm.generate(
        [prompt], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True), use_tqdm=False
    )
    if model is not None:
        static_generate(model, [prompt, prompt[:4]], 2, pad_token_id)


def _result(
    name: str, workload: Workload, timer: Timer, token_ids: list[list[int]], num_steps: int | None
) -> RunResult:
    num_output_tokens = sum(len(ids) for ids in token_ids)
    assert num_output_tokens == workload.num_output_tokens, (name, num_output_tokens)
    return RunResult(
        name=name,
        elapsed=timer.elapsed,
        num_requests=workload.num_requests,
        num_prompt_tokens=workload.num_prompt_tokens,
        num_output_tokens=num_output_tokens,
        output_token_ids=token_ids,
        num_steps=num_steps,
        cpu=timer.cpu,
    )
