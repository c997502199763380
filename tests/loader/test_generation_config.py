"""The model's recommended sampling defaults (vLLM's generation_config="auto"): a request that
sets no sampling field runs with the fields of the model's generation_config.json; "vllm"
ignores them; override_generation_config goes over them; the command line and an input line's
own fields win."""

import json
import shutil

import pytest

from pagedgen import LLM, SamplingParams
from pagedgen.loader.generation_config import model_sampling_defaults
from tests.cli_util import run_in_process

RECOMMENDED = {
    "do_sample": True,  # not a sampling field: vLLM ignores it, so do we
    "temperature": 0.6,
    "top_p": 0.9,
    "top_k": 20,
    "repetition_penalty": 1.1,
    "max_new_tokens": 7,
}
FIELDS = dict(temperature=0.6, top_p=0.9, top_k=20, repetition_penalty=1.1, max_tokens=7)
QUIET = dict(log=lambda message: None, kv_cache_memory=0.01)


@pytest.fixture(scope="module")
def model_with_defaults(tiny_llama_path, tmp_path_factory):
    folder = tmp_path_factory.mktemp("recommended")
    shutil.copytree(tiny_llama_path, folder, dirs_exist_ok=True)
    (folder / "generation_config.json").write_text(json.dumps(RECOMMENDED))
    return folder


def test_fields_as_vllm_reads_them(model_with_defaults, tiny_llama_path, tmp_path):
    assert model_sampling_defaults(model_with_defaults) == FIELDS
    assert model_sampling_defaults(model_with_defaults, "vllm") == {}
    assert model_sampling_defaults(tiny_llama_path) == {}  # no generation_config.json
    overrides = {"temperature": 0.2, "max_new_tokens": 3, "min_p": 0.05}
    assert model_sampling_defaults(model_with_defaults, "auto", overrides) == dict(
        FIELDS, temperature=0.2, max_tokens=3, min_p=0.05
    )
    assert model_sampling_defaults(tiny_llama_path, "vllm", {"top_k": 5}) == {"top_k": 5}
    # a folder of its own: its generation_config.json, whatever the model's says
    (tmp_path / "generation_config.json").write_text(json.dumps({"top_p": 0.5}))
    assert model_sampling_defaults(model_with_defaults, str(tmp_path)) == {"top_p": 0.5}
    with pytest.raises(ValueError, match="no generation_config.json"):
        model_sampling_defaults(model_with_defaults, str(tmp_path / "missing"))


def test_generate_without_params_runs_the_models_defaults(model_with_defaults):
    prompts = ["hello", "the cat"]
    llm = LLM(str(model_with_defaults), **QUIET)
    assert llm.get_default_sampling_params() == SamplingParams(**FIELDS)
    implicit = llm.generate(prompts, use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in implicit] == [7, 7]
    chats = llm.chat([{"role": "user", "content": "hi"}], use_tqdm=False)
    assert len(chats[0].outputs[0].token_ids) == 7
    plain = LLM(str(model_with_defaults), generation_config="vllm", **QUIET)
    assert plain.get_default_sampling_params() == SamplingParams()
    assert len(plain.generate(prompts[0], use_tqdm=False)[0].outputs[0].token_ids) == 16


@pytest.mark.slow
def test_defaults_sample_as_the_same_fields_given(model_with_defaults):
    """Two engines of one seed: one run on the model's defaults, one given the same fields,
    sample the same tokens (the defaults reach the sampler, not only max_tokens)."""
    prompts = ["hello", "the cat", "a"]
    implicit = LLM(str(model_with_defaults), **QUIET).generate(prompts, use_tqdm=False)
    given = LLM(str(model_with_defaults), generation_config="vllm", **QUIET).generate(
        prompts, SamplingParams(**FIELDS), use_tqdm=False
    )
    neutral = LLM(str(model_with_defaults), generation_config="vllm", **QUIET).generate(
        prompts, SamplingParams(max_tokens=7), use_tqdm=False
    )
    ids = [o.outputs[0].token_ids for o in implicit]
    assert ids == [o.outputs[0].token_ids for o in given]
    assert ids != [o.outputs[0].token_ids for o in neutral]


def completion_lengths(stdout: str) -> list[int]:
    return [json.loads(line)["completion_tokens"] for line in stdout.splitlines()]


def test_cli_takes_the_models_defaults_where_nothing_else_is_set(model_with_defaults, capsys):
    lines = b'{"prompt": "hello"}\n{"prompt": "abc", "max_tokens": 3}\n'
    model = ("-m", str(model_with_defaults), "--kv-cache-memory", "0.01", "--no-progress")
    code, stdout, stderr = run_in_process(capsys, "run", "-", "-o", "-", *model, stdin=lines)
    assert code == 0, stderr
    assert completion_lengths(stdout) == [7, 3]  # the model's max_new_tokens; the line's own
    assert "sampling defaults from the model's generation config" in stderr
    assert "'temperature': 0.6" in stderr

    code, stdout, stderr = run_in_process(
        capsys, "run", "-", "-o", "-", *model, "--max-tokens", "5", stdin=lines
    )
    assert code == 0 and completion_lengths(stdout) == [5, 3]  # the command line wins
    assert "'max_tokens'" not in stderr and "'temperature': 0.6" in stderr

    code, stdout, stderr = run_in_process(
        capsys, "run", "-", "-o", "-", *model, "--generation-config", "vllm", stdin=lines
    )
    assert code == 0 and completion_lengths(stdout) == [256, 3]  # pagedgen's own default
    assert "generation config" not in stderr

    overrides = '{"max_new_tokens": 4}'
    code, stdout, stderr = run_in_process(
        capsys, "run", "-", "-o", "-", *model, "--override-generation-config", overrides,
        stdin=lines,
    )  # fmt: skip
    assert code == 0 and completion_lengths(stdout) == [4, 3]

    code, stdout, stderr = run_in_process(
        capsys, "run", "-", "-o", "-", *model, "--override-generation-config", "{oops",
        stdin=lines,
    )  # fmt: skip
    assert code == 2 and "override_generation_config is not valid JSON" in stderr and stdout == ""


@pytest.mark.slow
def test_profile_takes_them_too(model_with_defaults, capsys):
    model = ("-m", str(model_with_defaults), "--simulate", "--json")
    for flags, expected in (((), 7.0), (("--max-tokens", "9"), 9.0)):
        code, stdout, stderr = run_in_process(
            capsys, "profile", "-", *model, *flags, stdin=b'{"prompt": "hello"}\n'
        )
        assert code == 0, stderr
        assert json.loads(stdout)["workload"]["mean_output_tokens"] == expected


@pytest.mark.slow
def test_generation_configs_eos_ids_stop_generation(tiny_llama_path, tmp_path):
    """An end-of-sequence id the generation config lists beyond config.json's (a chat model's end
    of turn) stops a completion as EOS does, finish_reason "stop"; "vllm" reads none of it, and
    ignore_eos runs past it."""
    prompt, params = [5, 6, 7], SamplingParams(temperature=0, max_tokens=8)
    plain = LLM(str(tiny_llama_path), **QUIET).generate([prompt], params, use_tqdm=False)[0]
    tokens = plain.outputs[0].token_ids
    assert plain.outputs[0].finish_reason == "length" and len(set(tokens)) > 1
    end_of_turn = tokens[2]  # the greedy continuation's third token
    folder = tmp_path / "model"
    shutil.copytree(tiny_llama_path, folder)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, end_of_turn]}))
    stopped = LLM(str(folder), **QUIET).generate([prompt], params, use_tqdm=False)[0].outputs[0]
    first = tokens.index(end_of_turn)
    assert stopped.token_ids == tokens[: first + 1] and stopped.finish_reason == "stop"
    assert stopped.stop_reason is None  # an EOS, not a stop_token_ids entry
    ignored = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    [through] = LLM(str(folder), **QUIET).generate([prompt], ignored, use_tqdm=False)
    assert through.outputs[0].token_ids == tokens
    [unread] = LLM(str(folder), generation_config="vllm", **QUIET).generate(
        [prompt], params, use_tqdm=False
    )
    assert unread.outputs[0].token_ids == tokens
