"""Every engine option is defined once (engine_options.ENGINE) and shared, with the same name
and default, by run, profile and bench; the command line builds it into an EngineConfig."""

from dataclasses import fields

import pytest
import typer
from typer.main import get_command
from typer.testing import CliRunner

from pagedgen.config import CompilationConfig, CudaAttentionConfig, EngineConfig
from pagedgen.entrypoints.cli import options as opt
from pagedgen.entrypoints.cli.engine_options import ENGINE
from pagedgen.entrypoints.cli.main import app


def _built(*args: str) -> EngineConfig:
    """The EngineConfig that these options build, through the shared definitions."""
    built: list[EngineConfig] = []
    probe = typer.Typer()

    @probe.command()
    @opt.with_options(ENGINE)
    def command(engine: EngineConfig) -> None:
        built.append(engine)

    result = CliRunner().invoke(probe, list(args))
    assert result.exit_code == 0, result.output
    return built[0]


def test_every_engine_option_is_an_engine_config_field():
    assert set(ENGINE.options) <= {field.name for field in fields(EngineConfig)}
    assert set(ENGINE.options) >= {"compilation_config", "cuda_attention_config", "num_threads"}


@pytest.mark.parametrize("name", ["run", "profile", "bench"])
def test_run_profile_and_bench_share_each_engine_option(name):
    params = {param.name: param for param in get_command(app).commands[name].params}
    shared = get_command(app).commands["run"].params
    for param in shared:
        if param.name in ENGINE.options:
            theirs = params[param.name]
            assert (theirs.opts, theirs.secondary_opts, theirs.default) == (
                param.opts, param.secondary_opts, param.default
            ), name  # fmt: skip
    assert "threads" not in params


def test_engine_options_build_the_typed_configs():
    engine = _built(
        "--compilation-config",
        '{"cudagraph_mode": "FULL_AND_PIECEWISE", "max_cudagraph_capture_size": 4096}',
        "--cuda-attention-config",
        '{"grouped_decode": true, "tensor_core_decode": null}',
        "--num-threads",
        "3",
    )
    assert engine.compilation_config == CompilationConfig("FULL_AND_PIECEWISE", 4096)
    assert engine.cuda_attention_config == CudaAttentionConfig(grouped_decode=True)
    assert engine.num_threads == 3
    assert _built() == EngineConfig()


def test_prefix_caching_takes_vllm_name_and_its_older_one():
    assert _built().enable_prefix_caching
    assert not _built("--no-enable-prefix-caching").enable_prefix_caching
    assert not _built("--no-prefix-caching").enable_prefix_caching
    assert _built("--no-enable-prefix-caching", "--prefix-caching").enable_prefix_caching


def test_a_bad_engine_option_is_a_usage_error_naming_it(capsys):
    from tests.cli_util import run_in_process

    code, _, stderr = run_in_process(capsys, "bench", "--compilation-config", '{"mode": 3}')
    assert code == 2 and "compilation_config has no field 'mode'" in stderr
    assert "'--compilation-config'" in stderr
    bad = '{"cudagraph_mode": "PIECEWISE"}'
    code, _, stderr = run_in_process(capsys, "run", "-", "-o", "-", "--compilation-config", bad)
    assert code == 2 and "'--compilation-config'" in stderr and "cudagraph_mode" in stderr
