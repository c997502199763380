import sys
import time
from collections.abc import Callable
from dataclasses import replace

import torch

from pagedgen.attention import get_attention_backend
from pagedgen.config import EngineConfig
from pagedgen.cpu_features import cpu_compute_dtype, describe_cpu_compute, isa_name
from pagedgen.engine.beam_search import BeamSearchParams, BeamSearchState
from pagedgen.engine.control_plane import build_control_plane, resolve_max_model_len
from pagedgen.engine.model_runner import ModelRunner
from pagedgen.engine.request import Request
from pagedgen.engine.sequence import Sequence, SequenceGroup, SequenceStatus
from pagedgen.engine.stats import EngineStats
from pagedgen.engine.stop_checker import StopChecker
from pagedgen.loader import load_model, resolve_model
from pagedgen.loader.weights import load_config, load_tokenizer
from pagedgen.outputs import RequestOutput
from pagedgen.sampling_params import SamplingParams

GIB = 1 << 30
DEFAULT_CPU_KV_CACHE_GIB = 4.0


def log_to_stderr(message: str) -> None:
    print(message, file=sys.stderr)


class LLMEngine:
    """Adds requests and runs steps: schedule, run the model, sample, stop, free.

    step() returns the requests that finished during it, so callers can stream results while
    the rest keep running.
    """

    def __init__(self, config: EngineConfig, log: Callable[[str], None] = log_to_stderr) -> None:
        self.config = config
        torch.manual_seed(config.seed)
        if config.num_threads is not None:
            torch.set_num_threads(config.num_threads)
        self.device = _pick_device(config.device)
        self.dtype = _pick_dtype(config.dtype, self.device)  # the weights' values and the KV cache
        compute_dtype = cpu_compute_dtype(self.dtype) if self.device.type == "cpu" else self.dtype
        resolved = resolve_model(config.model)
        self.hf_config = load_config(resolved)
        self.tokenizer = load_tokenizer(resolved)
        self.max_model_len = resolve_max_model_len(self.hf_config, config.max_model_len)
        head_size = getattr(self.hf_config, "head_dim", None) or (
            self.hf_config.hidden_size // self.hf_config.num_attention_heads
        )
        backend = get_attention_backend(
            config.attention_backend, self.device, head_size, config.block_size
        )
        model = load_model(
            resolved,
            self.hf_config,
            backend,
            self.max_model_len,
            self.dtype,
            self.device,
            compute_dtype,
        )
        head = model.attention_layers[0]
        self.bytes_per_token = ModelRunner.bytes_per_token(
            len(model.attention_layers), head.num_kv_heads, head.head_dim, self.dtype
        )
        bytes_per_block = self.bytes_per_token * config.block_size
        kv_bytes = self._kv_cache_bytes()
        num_blocks = int(kv_bytes // bytes_per_block)
        if num_blocks < 1:
            raise ValueError(f"kv_cache_memory={config.kv_cache_memory} GiB holds no block")
        num_cpu_blocks = int(config.swap_space * GIB // bytes_per_block)
        self.runner = ModelRunner(
            model, backend, num_blocks, config.block_size, self.device, self.dtype, num_cpu_blocks
        )
        self.block_manager, self.scheduler = build_control_plane(
            config, num_blocks, num_cpu_blocks, self.max_model_len
        )
        self.stop_checker = StopChecker(self.tokenizer, self.max_model_len)
        self.eos_token_ids = _eos_token_ids(self.hf_config, self.tokenizer)
        self.requests: dict[str, Request] = {}
        self.rejected: list[Request] = []
        self.stats = EngineStats()
        device = str(self.device)
        if self.device.type == "cpu":
            device = f"cpu {isa_name()}, {describe_cpu_compute(self.dtype)}"
        log(
            f"model {config.model} ({type(model).__name__}, {self.dtype}, {device}, "
            f"{backend.name} attention), max_model_len {self.max_model_len}"
        )
        log(
            f"KV cache: {num_blocks} blocks x {config.block_size} tokens = "
            f"{num_blocks * config.block_size} tokens, {kv_bytes / GIB:.2f} GiB "
            f"({self.bytes_per_token} bytes/token); CPU swap pool {num_cpu_blocks} blocks"
        )

    def _kv_cache_bytes(self) -> float:
        if self.config.kv_cache_memory is not None:
            return self.config.kv_cache_memory * GIB
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            return max(free * 0.9 - GIB, free * 0.5)
        return DEFAULT_CPU_KV_CACHE_GIB * GIB

    @property
    def num_blocks(self) -> int:
        return self.block_manager.num_blocks

    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams | BeamSearchParams | None = None,
        arrival_time: float | None = None,
    ) -> None:
        """Queues a prompt (text, or token ids) for sampling, parallel sampling or beam search."""
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already running")
        if isinstance(prompt, str):
            text, token_ids = prompt, self.tokenizer.encode(prompt)
        else:
            text, token_ids = None, list(prompt)
        beam = None
        if isinstance(params, BeamSearchParams):
            beam = BeamSearchState(params, self.eos_token_ids)
            sampling_params = params.sampling_params()
        else:
            sampling_params = params or SamplingParams()
            stop_ids = set(sampling_params.stop_token_ids)
            if not sampling_params.ignore_eos:
                stop_ids |= self.eos_token_ids
            sampling_params = replace(sampling_params, all_stop_token_ids=stop_ids)
        seq = Sequence(request_id, token_ids, sampling_params, arrival_time)
        group = SequenceGroup(
            request_id, seq, sampling_params, params.beam_width if beam is not None else None
        )
        request = Request(request_id, text, token_ids, group, beam)
        error = self.scheduler.add(group)
        if error is not None:
            seq.finish(SequenceStatus.FINISHED_IGNORED, error)
            self.rejected.append(request)
        else:
            self.requests[request_id] = request

    def abort_request(self, request_id: str) -> None:
        request = self.requests.pop(request_id, None)
        if request is None:
            return
        self.scheduler.abort(request.group)
        for seq in request.group.unfinished_seqs:
            seq.finish(SequenceStatus.FINISHED_ABORTED)
            self.scheduler.finish(seq)
            self.stop_checker.free(seq)

    def abort_unstarted_requests(self) -> list[str]:
        """Aborts every request none of whose tokens has been computed; returns their ids."""
        unstarted = [rid for rid, request in self.requests.items() if not request.is_started]
        for request_id in unstarted:
            self.abort_request(request_id)
        return unstarted

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests or self.rejected)

    @property
    def num_unfinished_requests(self) -> int:
        return len(self.requests) + len(self.rejected)

    def step(self) -> list[RequestOutput]:
        finished = [request.output(self.tokenizer) for request in self.rejected]
        self.rejected.clear()
        scheduled = self.scheduler.schedule()
        if scheduled.is_empty:
            if self.scheduler.has_unfinished() and not finished:
                raise RuntimeError("the scheduler can make no progress; the KV pool is too small")
            return finished
        start = time.perf_counter()
        sampled, samples = self.runner.execute(scheduled)
        self.stats.record_step(scheduled, time.perf_counter() - start)
        for seq, num_new in zip(scheduled.seqs, scheduled.num_new_tokens):
            seq.num_computed_tokens += num_new
        beam_rows: dict[str, dict[int, dict[int, float]]] = {}
        for i, seq in enumerate(sampled):
            logprobs = samples.logprobs[i] if samples.logprobs is not None else None
            if self.requests[seq.request_id].beam is not None:
                beam_rows.setdefault(seq.request_id, {})[seq.seq_id] = logprobs
                continue
            seq.append_token_id(samples.token_ids[i], logprobs)
            self.stop_checker.check(seq)
            if seq.is_finished:
                self.scheduler.finish(seq)
        for request_id, rows in beam_rows.items():
            request = self.requests[request_id]
            request.beam.step(request.group, rows, self.block_manager)
        self.scheduler.remove_finished_groups()
        for request_id in dict.fromkeys(seq.request_id for seq in sampled):
            request = self.requests[request_id]
            if request.is_finished:
                finished.append(request.output(self.tokenizer))
                del self.requests[request_id]
        self.stats.observe(self.scheduler, self.block_manager)
        return finished


def _pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was asked for, but torch sees no CUDA device")
    return device


def _pick_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, name)


def _eos_token_ids(hf_config, tokenizer) -> set[int]:
    ids = getattr(hf_config, "eos_token_id", None)
    ids = set(ids) if isinstance(ids, list) else ({ids} if ids is not None else set())
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids
