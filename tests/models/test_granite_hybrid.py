"""Granite 4.0 (granitemoehybrid): the hybrids' Mamba2 layers are refused, by name."""

from types import SimpleNamespace

import pytest
from transformers import AutoConfig, AutoModelForCausalLM

from pagedgen import LLM
from pagedgen.models.granite_moe_hybrid import check_supported
from tests.conftest import build_tokenizer
from tests.models.model_configs import COMMON


def test_hybrid_mamba_model_is_refused(tmp_path):
    """granite-4.0-h-*: Mamba2 layers among the attention ones."""
    config = AutoConfig.for_model(
        "granitemoehybrid",
        **dict(COMMON, num_hidden_layers=3),
        layer_types=["mamba", "attention", "mamba"],
        position_embedding_type="nope",
        num_local_experts=0,
        shared_intermediate_size=96,
        mamba_n_heads=8,
        mamba_d_state=16,
        mamba_chunk_size=16,
    )
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    build_tokenizer(tmp_path)
    with pytest.raises(ValueError, match=r"layers \[0, 2\] are Mamba2.*recurrent-state cache"):
        LLM(str(tmp_path))


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(layer_types=["attention", "mamba"]), r"layers \[1\] are Mamba2"),  # config.json's
        (dict(layer_types=["attention", "gated_deltanet"]), "layer_types"),
        (dict(layer_types=["attention"]), "layer_types"),
        (dict(position_embedding_type="alibi"), "position_embedding_type 'alibi'"),
        (dict(rope_parameters=dict(rope_theta=1e4, partial_rotary_factor=0.5)), "partial"),
        (dict(shared_intermediate_size=0), "shared_intermediate_size"),
    ],
)
def test_what_transformers_computes_otherwise_is_refused(changes, message):
    config = dict(
        num_hidden_layers=2,
        layer_types=["attention", "full_attention"],
        position_embedding_type="rope",
        rope_parameters=dict(rope_type="default", rope_theta=1e4),
        shared_intermediate_size=96,
    )
    check_supported(SimpleNamespace(**config))  # as given, supported
    with pytest.raises(ValueError, match=message):
        check_supported(SimpleNamespace(**dict(config, **changes)))
