"""Every architecture of models/test_models.py on a GPU: pagedgen's greedy tokens (float32, the
backend auto picks: CuPy kernels where they cover the head size, torch otherwise, as for MLA's
latent) against transformers' on the CPU. Skipped without a CUDA GPU."""

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from pagedgen import LLM, SamplingParams
from tests.conftest import build_tokenizer
from tests.models.test_models import (
    COMMON,
    CONFIGS,
    PROMPTS,
    reference_greedy,
    untie_initial_values,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_greedy_matches_transformers_on_cuda(name, tmp_path):
    """The reference runs the whole sequence every step, with eager attention where logits are
    soft-capped: GPU machines may carry an older transformers, whose SDPA path drops VaultGemma's
    cap and whose cached decode switches PhiMoE's LongRoPE factors mid-sequence (5.17)."""
    config = AutoConfig.for_model(**dict(COMMON, **CONFIGS[name]))
    torch.manual_seed(0)
    eager = "eager" if getattr(config, "attn_logit_softcapping", None) else None
    model = AutoModelForCausalLM.from_config(
        config, dtype=torch.float32, attn_implementation=eager
    ).eval()
    untie_initial_values(model)
    model.save_pretrained(tmp_path)
    build_tokenizer(tmp_path)
    llm = LLM(str(tmp_path), device="cuda", dtype="float32", kv_cache_memory=0.05)
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    for prompt, output in zip(PROMPTS, llm.generate(PROMPTS, params)):
        assert output.outputs[0].token_ids == reference_greedy(model, prompt, 16, use_cache=False)
