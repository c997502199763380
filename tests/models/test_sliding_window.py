"""Gemma 2, Gemma 3 and a sliding-window Mistral, tiny and random: greedy ids equal
transformers' for sequences several windows long, with prefix caching, under preemption by
recompute and by swap, on both CPU attention backends; blocks out of the window go back to the
pool while a sequence runs."""

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from pagedgen import LLM, SamplingParams
from tests.conftest import build_tokenizer
from tests.models.test_models import COMMON as TINY
from tests.models.test_models import reference_greedy
from tests.worker.test_spec_decode import OracleProposer

WINDOW = 16
COMMON = dict(TINY, pad_token_id=0, sliding_window=WINDOW)
CONFIGS = {
    # head_dim 32 != hidden / heads; soft caps low enough to change scores and logits
    "gemma2": dict(
        model_type="gemma2",
        num_hidden_layers=2,
        head_dim=32,
        query_pre_attn_scalar=24,
        attn_logit_softcapping=3.0,
        final_logit_softcapping=5.0,
    ),
    "gemma3": dict(
        model_type="gemma3_text",
        num_hidden_layers=3,
        head_dim=32,
        query_pre_attn_scalar=32,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
    ),
    "mistral": dict(model_type="mistral", num_hidden_layers=2),
}
SHARED = list(range(60, 100))  # 40 tokens: two sequences share its full blocks (prefix cache)
PROMPTS = [SHARED + [5, 9, 200], [7] * 23, SHARED + [1, 2], [3, 1, 4, 1, 5, 9, 2, 6]]
MAX_TOKENS = [40, 56, 30, 64]  # every sequence ends several windows long


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def windowed_model(request, tmp_path_factory):
    name = request.param
    config = AutoConfig.for_model(**dict(COMMON, **CONFIGS[name]))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    folder = tmp_path_factory.mktemp(name)
    model.save_pretrained(folder)
    build_tokenizer(folder)
    expected = [reference_greedy(model, p, n) for p, n in zip(PROMPTS, MAX_TOKENS)]
    return name, folder, expected


def generate(folder, **kwargs) -> tuple[LLM, list[list[int]]]:
    llm = LLM(str(folder), log=lambda _: None, **kwargs)
    if llm.engine.runner.backend.name == "cpu" and not kwargs.get("enforce_eager"):
        assert llm.engine.runner.decode_graphs is not None  # decode steps replay CPU graphs
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in MAX_TOKENS]
    outputs = llm.generate(PROMPTS, params)
    llm.engine.block_manager.check_integrity()
    return llm, [output.outputs[0].token_ids for output in outputs]


@pytest.mark.parametrize("backend", ["cpu", "torch"])
def test_greedy_matches_transformers_past_the_window(windowed_model, backend):
    name, folder, expected = windowed_model
    llm, token_ids = generate(
        folder, attention_backend=backend, block_size=8, max_num_seqs=4, kv_cache_memory=0.01
    )
    assert token_ids == expected
    assert llm.engine.block_manager.num_prefix_cache_hits > 0
    freed = llm.engine.block_manager.num_sliding_window_freed_blocks
    assert (freed > 0) == (name == "mistral")  # Gemma's global layers keep every block


def pool_gib(folder, name: str) -> float:
    """A pool of blocks of 8 too small for the 4 sequences at once, which grow to 9-11 blocks;
    Mistral's hold 3 each past the window."""
    config = AutoConfig.from_pretrained(folder)
    head_dim = 16 if name == "mistral" else 32
    bytes_per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * 4
    num_blocks = 11 if name == "mistral" else 24
    return num_blocks * 8 * bytes_per_token / 2**30


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_greedy_matches_transformers_under_preemption(windowed_model, mode):
    name, folder, expected = windowed_model
    llm, token_ids = generate(
        folder,
        block_size=8,
        max_num_seqs=4,
        preemption_mode=mode,
        kv_cache_memory=pool_gib(folder, name),
    )
    assert llm.engine.stats.num_preemptions >= 1
    assert token_ids == expected


@pytest.mark.parametrize("mode", [None, "recompute"])
def test_speculative_decoding_past_the_window(windowed_model, mode):
    """Drafts (the reference's own tokens, one in three proposals made wrong) verified past the
    window, blocks freed behind it, with and without preemption: greedy ids equal transformers'."""
    name, folder, expected = windowed_model
    spec = {"num_speculative_tokens": 4, "prompt_lookup_min": 1}
    memory = {"preemption_mode": mode, "kv_cache_memory": pool_gib(folder, name)} if mode else {}
    llm = LLM(str(folder), log=lambda _: None, block_size=8, speculative_config=spec, **memory)
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in MAX_TOKENS]
    plain = [(((ids,),)) for ids in expected]  # OracleProposer reads completion[0]
    llm.engine.output_processor.proposer = OracleProposer(plain, PROMPTS, params, k=4)
    outputs = llm.generate(PROMPTS, params, use_tqdm=False)
    llm.engine.block_manager.check_integrity()
    assert [output.outputs[0].token_ids for output in outputs] == expected
    assert llm.engine.stats.spec_decode.num_accepted_tokens > 50
    assert (llm.engine.stats.num_preemptions > 0) == (mode is not None)
    if name == "mistral":
        assert llm.engine.block_manager.num_sliding_window_freed_blocks > 0


def test_used_blocks_stop_growing_past_the_window(windowed_model):
    name, folder, _ = windowed_model
    if name != "mistral":
        pytest.skip("only a model whose every layer slides frees blocks")
    # No swap pool: checking one of this tiny model's millions of blocks every step is slow.
    llm = LLM(str(folder), log=lambda _: None, block_size=4, kv_cache_memory=0.01, swap_space=0)
    bm = llm.engine.block_manager
    used: list[int] = []

    def observe(engine) -> None:
        used.append(bm.num_used_blocks)
        bm.check_integrity()

    params = SamplingParams(temperature=0, max_tokens=120, ignore_eos=True)
    outputs = list(llm.stream([("long", [7, 8, 9], params)], on_step=observe))
    assert len(outputs[0].outputs[0].token_ids) == 120
    # a query sees its last 16 tokens: 4 blocks of 4, or 5 while a block fills
    window_blocks = WINDOW // 4 + 1
    assert max(used) == window_blocks
    assert used[-1] == 0  # the finished sequence let go of everything
    assert set(used[WINDOW:-1]) == {window_blocks - 1, window_blocks}  # flat past the window
    assert bm.num_sliding_window_freed_blocks == -(-(3 + 120) // 4) - window_blocks


def test_unsupported_architecture_fails_before_the_tokenizer_loads(tmp_path):
    config = AutoConfig.for_model("mamba", num_hidden_layers=1, hidden_size=16, vocab_size=257)
    config.save_pretrained(tmp_path)  # no tokenizer, no weights: neither may be needed
    with pytest.raises(ValueError, match="unsupported architecture.*Gemma3ForCausalLM"):
        LLM(str(tmp_path), log=lambda _: None)


def test_startup_line_prints_the_pool_size_asked(tmp_path):
    from tests.conftest import build_tokenizer as tokenizer_into

    config = AutoConfig.for_model(**dict(COMMON, **CONFIGS["mistral"]))
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    tokenizer_into(tmp_path)
    lines: list[str] = []
    LLM(str(tmp_path), log=lines.append, kv_cache_memory=0.005)
    assert "of 0.005 GiB asked" in next(line for line in lines if line.startswith("KV cache"))
