"""EngineConfig's checks of what a user can get wrong, and the typed configs it holds."""

import pytest

from pagedgen.config import CompilationConfig, CudaAttentionConfig, EngineConfig


@pytest.mark.parametrize("runner", ["generate", "pooling", "auto"])
@pytest.mark.parametrize(
    ("field", "value"), [("max_lora_rank", 0), ("max_num_batched_tokens", 0), ("max_loras", 0)]
)
def test_limits_are_checked_whatever_the_runner(runner, field, value):
    with pytest.raises(ValueError, match=f"{field} must be >= 1, got {value}"):
        EngineConfig(runner=runner, **{field: value})


def test_pooling_runner_refuses_sampling_only_features():
    with pytest.raises(ValueError, match="async_scheduling"):
        EngineConfig(runner="pooling", async_scheduling=True)
    EngineConfig(runner="generate", async_scheduling=True)


def test_typed_configs_from_dicts_json_or_themselves():
    config = EngineConfig(
        compilation_config='{"cudagraph_mode": "FULL_DECODE_ONLY"}',
        cuda_attention_config={"grouped_decode": False},
    )
    assert config.compilation_config == CompilationConfig(cudagraph_mode="FULL_DECODE_ONLY")
    assert config.cuda_attention_config == CudaAttentionConfig(grouped_decode=False)
    default = EngineConfig()
    assert default.compilation_config == CompilationConfig()
    assert default.cuda_attention_config == CudaAttentionConfig()
    same = CompilationConfig(max_cudagraph_capture_size=64)
    assert EngineConfig(compilation_config=same).compilation_config is same


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("compilation_config", '{"mode": 3}', "compilation_config has no field 'mode'"),
        ("compilation_config", "[1]", "compilation_config must be a JSON object"),
        ("compilation_config", "{", "compilation_config is not valid JSON"),
        ("cuda_attention_config", {"prefetch": True}, "has no field 'prefetch'"),
        ("cuda_attention_config", {"prefill_kernel": None}, "prefill_kernel must be true or"),
    ],
)
def test_bad_typed_configs_name_the_field(name, value, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(**{name: value})


@pytest.mark.parametrize(
    ("given", "dtype"),
    [("half", "float16"), ("float", "float32"), ("float16", "float16"), ("auto", "auto")],
)
def test_dtype_takes_vllm_aliases(given, dtype):
    assert EngineConfig(dtype=given).dtype == dtype


def test_a_bad_dtype_lists_the_aliases_too():
    with pytest.raises(ValueError, match="'half', 'float'\\), got 'double'"):
        EngineConfig(dtype="double")


@pytest.mark.parametrize("name", ["tensor_parallel_size", "pipeline_parallel_size"])
def test_parallel_sizes_are_one_device(name):
    assert getattr(EngineConfig(**{name: 1}), name) == 1
    with pytest.raises(ValueError, match=f"{name} must be 1, got 2: one pagedgen process.*--ray"):
        EngineConfig(**{name: 2})
