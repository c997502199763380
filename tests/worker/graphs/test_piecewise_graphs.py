"""Piecewise graphs (engine/piecewise_graphs.py), proven with CPU recordings as the pieces:
steps with prefill rows replay the pieces between attention calls, attention runs over each
step's own metadata, and every output equals the eager engine's; a capture that cannot be
replayed is refused and leaves nothing behind."""

import gc
import random
import weakref
from collections.abc import Callable

import pytest
from torch.utils._python_dispatch import _get_current_dispatch_mode

from pagedgen import LLM, SamplingParams
from pagedgen.config import CompilationConfig
from pagedgen.kernels import cpu_ops
from pagedgen.layers.linear import gemm_rows
from pagedgen.worker.cpu_graphs import CaptureRefused, CpuPieces
from pagedgen.worker.graph_capture import capture_piecewise_graphs
from pagedgen.worker.piecewise_graphs import MAX_NUM_TOKENS, PiecewiseGraphs, piecewise_token_sizes
from tests.models.model_configs import CONFIGS
from tests.models.test_models import tiny_model  # noqa: F401 (the fixture, parametrized below)
from tests.worker.graphs.test_cpu_graphs import preemption_case
from tests.worker.test_async_scheduling import ENGINE, outputs, prompts_of

needs_cpu_ops = pytest.mark.skipif(
    cpu_ops.cpu_ops_error() is not None, reason=f"no C kernels here: {cpu_ops.cpu_ops_error()}"
)
# Few sequences and a small token budget: prompts join running decodes step after step.
MIXED = dict(max_num_seqs=6, max_num_batched_tokens=40, kv_cache_memory=0.01)


def test_token_sizes():
    assert piecewise_token_sizes(64, 8) == [8, 16, 24, 32, 40, 48, 56, 64]
    assert piecewise_token_sizes(40, 16) == [16, 32, 40]
    assert piecewise_token_sizes(512) == list(range(32, 513, 32))
    assert piecewise_token_sizes(4096) == [*range(32, 1025, 32), *range(1152, 4097, 128)]
    assert piecewise_token_sizes(1100) == [*range(32, 1025, 32), 1100]
    assert all(size == gemm_rows(size) for size in piecewise_token_sizes(MAX_NUM_TOKENS))
    assert all(size == gemm_rows(size) for size in piecewise_token_sizes(8192))


@pytest.mark.parametrize(
    ("mode", "on_gpu", "on_cpu"), [(None, True, False), ("FULL_DECODE_ONLY", False, False),
                                   ("FULL_AND_PIECEWISE", True, True)]
)  # fmt: skip
def test_pieces_are_on_by_default_on_a_gpu_only(mode, on_gpu, on_cpu):
    config = CompilationConfig(cudagraph_mode=mode)
    assert (config.piecewise(on_gpu=True), config.piecewise(on_gpu=False)) == (on_gpu, on_cpu)


def test_the_largest_piecewise_step_on_a_gpu_is_a_compilation_config_field():
    assert CompilationConfig().max_cudagraph_capture_size == MAX_NUM_TOKENS
    parsed = CompilationConfig.parse('{"max_cudagraph_capture_size": 4096}')
    assert parsed.max_cudagraph_capture_size == 4096
    for bad in (0, -5, "lots", True):
        with pytest.raises(ValueError, match="max_cudagraph_capture_size"):
            CompilationConfig.parse({"max_cudagraph_capture_size": bad})
    with pytest.raises(ValueError, match="cudagraph_mode"):
        CompilationConfig(cudagraph_mode="PIECEWISE")


PIECEWISE = {"compilation_config": {"cudagraph_mode": "FULL_AND_PIECEWISE"}}


def piecewise_llm(path, **kwargs) -> LLM:
    llm = LLM(str(path), **ENGINE, **PIECEWISE, **kwargs)
    assert isinstance(llm.engine.runner.piecewise_graphs, PiecewiseGraphs)
    return llm


def count_piecewise_replays(monkeypatch) -> list[int]:
    """[replays, of which with a prefill row], patched on the class: a spy on the instance
    would tie the graphs into a reference cycle that outlives the test (LLM's gc.freeze)."""
    counted, replay = [0, 0], PiecewiseGraphs.replay

    def spy(graphs, batch_size, metadata, num_tokens):
        counted[0] += 1
        counted[1] += metadata.num_decode_seqs < metadata.num_seqs
        return replay(graphs, batch_size, metadata, num_tokens)

    monkeypatch.setattr(PiecewiseGraphs, "replay", spy)
    return counted


def mixed_params(num_prompts: int) -> list[SamplingParams]:
    rng = random.Random(1)
    return [
        SamplingParams(temperature=0, max_tokens=rng.randint(1, 30), ignore_eos=True, logprobs=2)
        if i % 3
        else SamplingParams(temperature=0.9, top_p=0.9, seed=i, max_tokens=rng.randint(1, 30))
        for i in range(num_prompts)
    ]


@needs_cpu_ops
@pytest.mark.parametrize("async_scheduling", [False, True])
def test_steps_with_prefill_rows_from_pieces_equal_eager_ones(
    tiny_llama_path, monkeypatch, async_scheduling
):
    """Chunked prompts beside decodes, shared prefixes (prefix-cache hits), seeded sampling,
    logprobs and prompt logprobs, with and without async scheduling's placeholders."""
    prompts = prompts_of(5, 24, shared_prefix=17)
    params = mixed_params(len(prompts))
    params[4] = SamplingParams(temperature=0, max_tokens=5, prompt_logprobs=1)
    kwargs = dict(MIXED, async_scheduling=async_scheduling)
    eager = outputs(
        LLM(str(tiny_llama_path), **ENGINE, enforce_eager=True, **kwargs), prompts, params
    )
    llm = piecewise_llm(tiny_llama_path, **kwargs)
    assert llm.engine.runner.piecewise_graphs.token_sizes == [8, 16, 24, 32, 40]
    replays = count_piecewise_replays(monkeypatch)
    assert outputs(llm, prompts, params) == eager
    assert replays[1] >= 10, replays
    prompt_logprobs = llm.generate([prompts[4]], params[4])[0].prompt_logprobs
    eager_llm = LLM(str(tiny_llama_path), **ENGINE, enforce_eager=True, **kwargs)
    assert prompt_logprobs == eager_llm.generate([prompts[4]], params[4])[0].prompt_logprobs


@needs_cpu_ops
@pytest.mark.parametrize("preemption_mode", ["recompute", "swap"])
def test_pieces_through_preemption(tiny_llama_path, monkeypatch, preemption_mode):
    prompts, params, kwargs = preemption_case(preemption_mode)
    eager = outputs(
        LLM(str(tiny_llama_path), **ENGINE, enforce_eager=True, **kwargs), prompts, params
    )
    llm = piecewise_llm(tiny_llama_path, **kwargs)
    replays = count_piecewise_replays(monkeypatch)
    assert outputs(llm, prompts, params) == eager
    assert replays[1] > 0
    assert sum(llm.engine.scheduler.num_preemptions.values()) > 0


def test_steps_past_the_largest_bucket_run_eagerly(tiny_llama_path, monkeypatch):
    llm = piecewise_llm(tiny_llama_path, max_num_batched_tokens=200, kv_cache_memory=0.01)
    assert llm.engine.runner.piecewise_graphs.max_num_tokens == 64
    replays = count_piecewise_replays(monkeypatch)
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    eager = LLM(str(tiny_llama_path), **ENGINE, enforce_eager=True, kv_cache_memory=0.01)
    prompt = list(range(1, 150))
    assert outputs(llm, [prompt], params) == outputs(eager, [prompt], params)
    assert replays == [0, 0]  # 149 prompt tokens, then decode graphs


@pytest.mark.parametrize("mode", [None, "FULL_DECODE_ONLY"])
def test_the_default_captures_no_pieces_on_the_cpu(tiny_llama_path, mode):
    config = {"cudagraph_mode": mode}
    llm = LLM(str(tiny_llama_path), **ENGINE, kv_cache_memory=0.01, compilation_config=config)
    assert llm.engine.runner.piecewise_graphs is None


@pytest.mark.parametrize("tiny_model", sorted(CONFIGS), indirect=True)
@needs_cpu_ops
def test_architectures_through_pieces(tiny_model, monkeypatch):  # noqa: F811
    """Every architecture whose steps graphs serve (on a GPU pieces are on by default): ALiBi,
    sliding windows, partial and no RoPE, separate Q/K/V projections, NoPE layers, whatever
    each layer's attention is called with reaches it from the pieces."""
    folder, _ = tiny_model
    llm = LLM(str(folder), **ENGINE, **PIECEWISE, **MIXED)
    if not llm.engine.runner.model.supports_graphs:
        pytest.skip(f"{type(llm.engine.runner.model).__name__} routes tokens on the host")
    assert isinstance(llm.engine.runner.piecewise_graphs, PiecewiseGraphs)
    prompts = prompts_of(7, 10)
    params = mixed_params(len(prompts))
    eager = outputs(LLM(str(folder), **ENGINE, enforce_eager=True, **MIXED), prompts, params)
    replays = count_piecewise_replays(monkeypatch)
    assert outputs(llm, prompts, params) == eager
    assert replays[1] > 0


class PlantedBug:
    """Each breaks one thing the pieces rely on; the equality tests above must catch it."""

    @staticmethod
    def stale_positions(monkeypatch, graphs: PiecewiseGraphs) -> None:
        fill = PiecewiseGraphs.fill
        monkeypatch.setattr(
            PiecewiseGraphs, "fill", lambda self, ids, pos, slots: fill(self, ids, 0 * pos, slots)
        )

    @staticmethod
    def capture_metadata(monkeypatch, graphs: PiecewiseGraphs) -> None:
        replay = PiecewiseGraphs.replay
        monkeypatch.setattr(
            PiecewiseGraphs, "replay", lambda self, b, _, n: replay(self, b, self.state.metadata, n)
        )

    @staticmethod
    def padding_into_block_zero(monkeypatch, graphs: PiecewiseGraphs) -> None:
        graphs.pad_slot = 0


@needs_cpu_ops
@pytest.mark.parametrize("bug", ["stale_positions", "capture_metadata", "padding_into_block_zero"])
def test_planted_bugs_change_outputs(tiny_llama_path, monkeypatch, bug):
    prompts = prompts_of(5, 12, shared_prefix=17)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    eager = outputs(
        LLM(str(tiny_llama_path), **ENGINE, enforce_eager=True, **MIXED), prompts, params
    )
    llm = piecewise_llm(tiny_llama_path, **MIXED)
    getattr(PlantedBug, bug)(monkeypatch, llm.engine.runner.piecewise_graphs)
    assert outputs(llm, prompts, params) != eager


def test_a_refused_capture_leaves_nothing_behind(tiny_llama_path, monkeypatch):
    """An op that hands a value to Python inside a piece refuses the capture; the backend keeps
    its own attend and no recording stays active."""
    llm = LLM(str(tiny_llama_path), **ENGINE, kv_cache_memory=0.01)
    runner = llm.engine.runner
    norm_class = type(runner.model.layers[1].input_layernorm)
    forward = norm_class.forward

    def branching(self, *args):
        out = forward(self, *args)
        first = out[0] if isinstance(out, tuple) else out
        if first.sum().item() > float("inf"):  # a value back to Python
            raise AssertionError
        return out

    with monkeypatch.context() as patch:
        patch.setattr(norm_class, "forward", branching)
        with pytest.raises(CaptureRefused):
            capture_piecewise_graphs(runner, CpuPieces(), [8, 16])
    assert "attend" not in vars(runner.backend)
    assert _get_current_dispatch_mode() is None
    assert runner.piecewise_graphs is None
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    eager = LLM(str(tiny_llama_path), **ENGINE, enforce_eager=True, kv_cache_memory=0.01)
    assert outputs(llm, prompts_of(2, 3), params) == outputs(eager, prompts_of(2, 3), params)


class RecordOnlyPieces(CpuPieces):
    """Pieces whose capture leaves what it recorded unwritten, as a CUDA graph's capture
    records kernels without running them: only replays compute."""

    def end(self) -> Callable[[], None]:
        replay = super().end()
        self.poison()
        return replay


@needs_cpu_ops
def test_a_capture_that_computes_nothing_is_checked_against_the_eager_forward(
    tiny_llama_path, monkeypatch
):
    """The replay is compared with an eager forward, not with what the capture left behind
    (the first GPU run of piecewise graphs refused every capture that way)."""
    llm = LLM(str(tiny_llama_path), **ENGINE, **MIXED)
    runner = llm.engine.runner
    capture_piecewise_graphs(runner, RecordOnlyPieces(), [8, 16, 24, 32, 40])
    prompts = prompts_of(5, 24, shared_prefix=17)
    params = mixed_params(len(prompts))
    eager = outputs(
        LLM(str(tiny_llama_path), **ENGINE, enforce_eager=True, **MIXED), prompts, params
    )
    replays = count_piecewise_replays(monkeypatch)
    assert outputs(llm, prompts, params) == eager
    assert replays[1] >= 10, replays


@needs_cpu_ops
def test_drafts_through_pieces(tiny_llama_path, monkeypatch):
    """Speculative decoding's verify steps (drafts as rows after each decode's token, most
    accepted, some rejected) beside prompts joining, from the pieces."""
    from tests.worker.test_spec_decode import SPEC, OracleProposer, repetitive_prompts

    prompts = repetitive_prompts(4, 16)
    params = mixed_params(len(prompts))
    eager = outputs(
        LLM(str(tiny_llama_path), **ENGINE, enforce_eager=True, **MIXED), prompts, params
    )
    llm = piecewise_llm(tiny_llama_path, speculative_config=SPEC, **MIXED)
    llm.engine.output_processor.proposer = OracleProposer(eager, prompts, params, k=4)
    replays = count_piecewise_replays(monkeypatch)
    assert outputs(llm, prompts, params) == eager
    assert replays[1] >= 10, replays
    assert llm.engine.stats.spec_decode.num_accepted_tokens >= 20


def test_a_dropped_engine_frees_its_pieces_without_a_collection(tiny_llama_path, monkeypatch):
    """No reference cycle through the pieces: LLM's start-up ends with gc.freeze(), so an engine
    kept alive by one would hold its model and KV pool for good."""
    llm = piecewise_llm(tiny_llama_path, **MIXED)
    runner = llm.engine.runner
    refs = [weakref.ref(x) for x in (runner.piecewise_graphs, runner.model, runner.kv_cache)]
    del runner
    gc.disable()
    try:
        del llm
        assert [ref() for ref in refs] == [None, None, None]
    finally:
        gc.enable()
