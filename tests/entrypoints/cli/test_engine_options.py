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


def test_vllm_model_options_build_the_config():
    engine = _built(
        "--dtype", "half", "-tp", "1", "--pipeline-parallel-size", "1",
        "--download-dir", "/hub", "--revision", "v2", "--tokenizer", "org/tok",
    )  # fmt: skip
    assert engine.dtype == "float16"
    assert (engine.tensor_parallel_size, engine.pipeline_parallel_size) == (1, 1)
    assert (engine.download_dir, engine.revision, engine.tokenizer) == ("/hub", "v2", "org/tok")
    assert _built("--dtype", "float").dtype == "float32"


@pytest.mark.parametrize("option", ["--tensor-parallel-size", "-tp", "--pipeline-parallel-size"])
def test_more_than_one_device_is_a_usage_error(capsys, option):
    from tests.cli_util import run_in_process

    code, _, stderr = run_in_process(capsys, "run", "-", "-o", "-", option, "2")
    assert code == 2 and "one pagedgen process runs on one device" in stderr
    assert "--ray" in stderr and "--shard" in stderr


def test_best_of_is_said_unsupported_not_a_near_name(capsys):
    from tests.cli_util import run_in_process

    code, _, stderr = run_in_process(capsys, "run", "-", "-o", "-", "--best-of", "2")
    assert code == 2 and "--best-of is not supported" in stderr and "--stop" not in stderr


@pytest.mark.parametrize("command", [[], ["run"], ["profile"], ["bench"], ["merge"]])
def test_h_is_help_for_every_command(capsys, command):
    from tests.cli_util import run_in_process

    code, stdout, _ = run_in_process(capsys, *command, "-h")
    _, long_help, _ = run_in_process(capsys, *command, "--help")
    assert code == 0 and stdout.startswith("Usage: pagedgen") and stdout == long_help


def test_version(capsys):
    import pagedgen
    from tests.cli_util import run_in_process

    assert run_in_process(capsys, "--version")[:2] == (0, f"pagedgen {pagedgen.__version__}\n")


def test_gpu_memory_utilization_is_ignored_on_a_cpu_as_vllm_does(monkeypatch):
    import torch

    from pagedgen.entrypoints.cli.checks import check_engine_fits

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    check_engine_fits(_built("--gpu-memory-utilization", "0.5", "--async-scheduling"))


def test_a_vllm_command_line_runs_unchanged(tiny_llama_path, tmp_path, capsys, monkeypatch):
    import shutil

    from tests.cli_util import read_records, run_in_process, tiny, write_jsonl

    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "empty"))
    repo = tmp_path / "hub" / "models--tiny--llama"
    shutil.copytree(tiny_llama_path, repo / "snapshots" / ("b" * 40))
    (repo / "refs").mkdir()
    (repo / "refs" / "v2").write_text("b" * 40)
    src = write_jsonl(tmp_path / "in.jsonl", [{"prompt": "hello"}])
    vllm = [
        "--model", "tiny/llama", "--download-dir", str(tmp_path / "hub"), "--revision", "v2",
        "--tokenizer", str(tiny_llama_path), "--tensor-parallel-size", "1", "--dtype", "float",
        "--gpu-memory-utilization", "0.5", "--async-scheduling",
    ]  # fmt: skip
    out = tmp_path / "out.jsonl"
    code, _, stderr = run_in_process(
        capsys, "run", str(src), "-o", str(out), *tiny(tiny_llama_path), *vllm
    )
    assert code == 0, stderr
    assert [r["finish_reason"] for r in read_records(out)] == ["length"]


def test_help_and_an_empty_input_import_no_torch_nor_transformers(tmp_path):
    """`pagedgen --help`, `run --help` and a run of an empty input answer without the heavy
    imports (0.13, 0.2 and 0.45 s, not 2.5 and 3.5): those load when a model does."""
    import subprocess
    import sys

    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    code = (
        "import sys\n"
        "from pagedgen.entrypoints.cli.main import app\n"
        "for args in (['--help'], ['run', '--help'], ['profile', '-h'], ['bench', '-h'],\n"
        f"             ['run', {str(empty)!r}, '-o', {str(tmp_path / 'out.jsonl')!r}]):\n"
        "    try:\n"
        "        app(args, prog_name='pagedgen')\n"
        "    except SystemExit as e:\n"
        "        assert e.code == 0, e.code\n"
        "heavy = {'torch', 'transformers', 'numpy', 'datasets'} & set(sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, stdout=subprocess.DEVNULL)
    assert (tmp_path / "out.jsonl").read_text() == ""
