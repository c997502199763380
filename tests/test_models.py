"""Greedy equality with transformers for tiny random-weight models of every architecture."""

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from pagedgen import LLM, SamplingParams
from pagedgen.engine.kv_geometry import KVGeometry
from tests.conftest import build_tokenizer

COMMON = dict(
    vocab_size=257,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    initializer_range=0.3,
    eos_token_id=256,
    bos_token_id=256,
)

GRANITE = dict(  # Granite 3's multipliers, of its 2B model
    pad_token_id=0,
    embedding_multiplier=12.0,
    attention_multiplier=0.015625,
    residual_multiplier=0.22,
    logits_scaling=8.0,
)

CONFIGS = {
    "llama": dict(model_type="llama", tie_word_embeddings=False),
    "llama3-rope-tied": dict(
        model_type="llama",
        tie_word_embeddings=True,
        rope_scaling=dict(
            rope_type="llama3",
            factor=8.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=64,
        ),
    ),
    "mistral": dict(model_type="mistral", sliding_window=None),
    "qwen2": dict(model_type="qwen2", tie_word_embeddings=True),
    "qwen3": dict(model_type="qwen3", head_dim=32, tie_word_embeddings=False),
    "seed-oss": dict(  # q/k/v biased, o not
        model_type="seed_oss", attention_bias=True, attention_out_bias=False, pad_token_id=0
    ),
    "phi3": dict(model_type="phi3", pad_token_id=0, sliding_window=None),
    "olmo2": dict(model_type="olmo2", pad_token_id=0),
    "olmo3": dict(  # three windowed layers of four, a rope base per kind of layer
        model_type="olmo3",
        num_hidden_layers=4,
        sliding_window=8,
        pad_token_id=0,
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "default", "rope_theta": 500000.0},
        },
    ),
    "exaone4": dict(  # post-sublayer norms, per-head q/k norms, 3 windowed layers, 1 NoPE one
        model_type="exaone4",
        num_hidden_layers=4,
        sliding_window=8,
        layer_types=["sliding_attention"] * 3 + ["full_attention"],
        pad_token_id=0,
    ),
    "mixtral": dict(model_type="mixtral", num_local_experts=4, num_experts_per_tok=2),
    "qwen3-moe": dict(  # layer 0 dense, layer 1 a mixture
        model_type="qwen3_moe",
        head_dim=32,
        num_experts=6,
        num_experts_per_tok=2,
        moe_intermediate_size=48,
        norm_topk_prob=True,
        mlp_only_layers=[0],
    ),
    "qwen2-moe": dict(  # a shared expert, gated; layer 1 dense (mlp_only_layers)
        model_type="qwen2_moe",
        num_experts=6,
        num_experts_per_tok=2,
        moe_intermediate_size=48,
        shared_expert_intermediate_size=96,
        norm_topk_prob=False,
        mlp_only_layers=[1],
    ),
    "minimax-m2": dict(  # whole-projection q/k norms, rotary_dim 16 of 32, biased sigmoid routing
        model_type="minimax_m2",
        head_dim=32,
        rotary_dim=16,
        num_local_experts=6,
        num_experts_per_tok=2,
    ),
    "olmoe": dict(  # whole-projection q/k norms, biased projections, softmax top-2 of 6
        model_type="olmoe",
        num_experts=6,
        num_experts_per_tok=2,
        norm_topk_prob=False,
        attention_bias=True,
        pad_token_id=0,
    ),
    "gpt-oss": dict(  # a window of 8 and full attention, sinks, YaRN, biased experts
        model_type="gpt_oss",
        head_dim=64,
        num_hidden_layers=4,
        layer_types=["sliding_attention", "full_attention"] * 2,
        sliding_window=8,
        num_local_experts=4,
        num_experts_per_tok=2,
        rope_parameters=dict(
            rope_type="yarn",
            factor=4.0,
            beta_fast=32.0,
            beta_slow=1.0,
            truncate=False,
            original_max_position_embeddings=64,
            rope_theta=150000.0,
        ),
        tie_word_embeddings=False,
    ),
    "deepseek-v3": dict(  # MLA with a low-rank query, sigmoid routing in groups, YaRN
        model_type="deepseek_v3",
        num_key_value_heads=4,
        q_lora_rank=24,
        kv_lora_rank=32,
        qk_rope_head_dim=16,
        qk_nope_head_dim=16,
        v_head_dim=24,
        n_routed_experts=8,
        num_experts_per_tok=2,
        n_group=4,
        topk_group=2,
        moe_intermediate_size=32,
        first_k_dense_replace=1,
        n_shared_experts=1,
        routed_scaling_factor=2.5,
        rope_parameters=dict(
            rope_type="yarn",
            factor=4.0,
            mscale=1.0,
            mscale_all_dim=1.0,
            beta_fast=32.0,
            beta_slow=1.0,
            original_max_position_embeddings=64,
            rope_theta=10000.0,
        ),
    ),
    "deepseek-v2": dict(  # MLA, softmax routing limited to the best groups, 2 shared experts
        model_type="deepseek_v2",
        num_key_value_heads=4,
        q_lora_rank=None,
        kv_lora_rank=32,
        qk_rope_head_dim=16,
        qk_nope_head_dim=16,
        v_head_dim=24,
        n_routed_experts=8,
        num_experts_per_tok=2,
        topk_method="group_limited_greedy",
        n_group=4,
        topk_group=1,  # fewer groups than experts chosen, or the limit changes nothing
        moe_intermediate_size=32,
        first_k_dense_replace=1,
        n_shared_experts=2,
        routed_scaling_factor=1.5,
    ),
    "glm": dict(  # half of each head rotates, in interleaved pairs; gate/up one tensor
        model_type="glm",
        head_dim=32,
        partial_rotary_factor=0.5,
        attention_bias=True,
        pad_token_id=0,
    ),
    "glm4": dict(  # and each sublayer's output normed again
        model_type="glm4",
        head_dim=32,
        partial_rotary_factor=0.5,
        attention_bias=True,
        pad_token_id=0,
    ),
    "ernie4_5": dict(  # interleaved rotary pairs over the whole head, every projection biased
        model_type="ernie4_5", use_bias=True, tie_word_embeddings=True, pad_token_id=0
    ),
    "glm4-moe": dict(  # GLM-4.5: half of each head rotates, q/k norms, V3's routing
        model_type="glm4_moe",
        head_dim=32,
        partial_rotary_factor=0.5,
        attention_bias=True,
        use_qk_norm=True,
        n_routed_experts=8,
        num_experts_per_tok=2,
        n_group=4,
        topk_group=2,
        moe_intermediate_size=32,
        first_k_dense_replace=1,
        n_shared_experts=1,
        routed_scaling_factor=2.5,
    ),
    "granite": dict(model_type="granite", tie_word_embeddings=True, **GRANITE),
    "granitemoe": dict(  # softmax over the top-2 logits of 4 experts
        model_type="granitemoe", num_local_experts=4, num_experts_per_tok=2, **GRANITE
    ),
    "granitemoeshared": dict(  # and a shared expert
        model_type="granitemoeshared",
        num_local_experts=4,
        num_experts_per_tok=2,
        shared_intermediate_size=96,
        **GRANITE,
    ),
    "smollm3": dict(
        model_type="smollm3", num_hidden_layers=3, no_rope_layers=[1, 0, 1], pad_token_id=0
    ),
    "phi3-longrope": dict(  # Phi-3's 128k models: the short factors up to 128 tokens
        model_type="phi3",
        pad_token_id=0,
        sliding_window=None,
        original_max_position_embeddings=128,
        rope_scaling=dict(
            type="longrope",
            short_factor=[1.0, 1.1, 1.3, 1.0, 2.0, 1.0, 1.5, 1.2],
            long_factor=[4.0] * 8,
        ),  # fmt: skip
    ),
    "phi3-partial-rotary": dict(  # Phi-4-mini's shape: a quarter of each head does not rotate
        model_type="phi3", pad_token_id=0, partial_rotary_factor=0.75, tie_word_embeddings=True
    ),
}

PROMPTS = [[5, 9, 200, 31], [7] * 23, list(range(40, 90)), [100], [3, 1, 4, 1, 5, 9, 2, 6]]


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def tiny_model(request, tmp_path_factory):
    name = request.param
    kwargs = dict(COMMON, **CONFIGS[name])
    config = AutoConfig.for_model(**kwargs)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    for name, buffer in model.named_buffers():  # DeepSeek-V3's router bias, zeros at init
        if name.endswith("e_score_correction_bias"):
            buffer.normal_(0.0, 0.2)
    folder = tmp_path_factory.mktemp(name)
    model.save_pretrained(folder)
    build_tokenizer(folder)
    return folder, model


def reference_greedy(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    out = model.generate(
        torch.tensor([prompt]),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
    )
    return out[0, len(prompt) :].tolist()


def test_greedy_matches_transformers(tiny_model):
    folder, hf_model = tiny_model
    max_tokens = [12, 30, 20, 25, 16]
    llm = LLM(str(folder), max_num_seqs=3, kv_cache_memory=0.01)
    model = llm.engine.runner.model
    if llm.engine.runner.backend.name == "cpu" and model.supports_graphs:  # CPU graphs replay
        assert llm.engine.runner.decode_graphs is not None
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in max_tokens]
    outputs = llm.generate(PROMPTS, params)
    for prompt, n, output in zip(PROMPTS, max_tokens, outputs):
        assert output.outputs[0].token_ids == reference_greedy(hf_model, prompt, n)


def test_greedy_matches_transformers_under_preemption(tiny_model):
    folder, hf_model = tiny_model
    # 10 blocks of 8 tokens, while the 4 sequences grow to 4 blocks each
    bytes_per_token = KVGeometry.of(
        AutoConfig.from_pretrained(folder), torch.float32
    ).bytes_per_token
    llm = LLM(str(folder), block_size=8, kv_cache_memory=10 * 8 * bytes_per_token / 2**30)
    prompts = [PROMPTS[0], PROMPTS[4], PROMPTS[3], [8, 8, 8]]
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    assert llm.engine.stats.num_preemptions >= 1
    for prompt, output in zip(prompts, outputs):
        assert output.outputs[0].token_ids == reference_greedy(hf_model, prompt, 24)


def test_logprobs_match_transformers(tiny_model):
    """Each prompt token's log-probability, against transformers' full forward: catches what
    greedy tokens cannot, a scale on the logits (Granite's logits_scaling) among others."""
    folder, hf_model = tiny_model
    llm = LLM(str(folder), kv_cache_memory=0.01, log=lambda m: None)
    prompts = [p for p in PROMPTS if len(p) > 1]
    params = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0)
    for prompt, output in zip(prompts, llm.generate(prompts, params)):
        with torch.no_grad():
            logits = hf_model(torch.tensor([prompt])).logits[0, :-1].float()
        expected = torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(prompt[1:])[:, None])
        got = [step[token] for step, token in zip(output.prompt_logprobs[1:], prompt[1:])]
        torch.testing.assert_close(torch.tensor(got), expected.squeeze(1), atol=1e-4, rtol=1e-4)


def test_unsupported_architecture_is_refused(tmp_path):
    config = AutoConfig.for_model("gpt2", n_layer=1, n_head=2, n_embd=16, vocab_size=257)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    build_tokenizer(tmp_path)
    with pytest.raises(ValueError, match="unsupported architecture.*LlamaForCausalLM"):
        LLM(str(tmp_path))
