"""LoRA adapters against PEFT: every request of a mixed batch gets its own adapter's greedy
tokens, with adapters made and run by PEFT itself on tiny random-weight models."""

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from pagedgen import LLM, BeamSearchParams, LoRARequest, SamplingParams
from pagedgen.entrypoints.io.records import InputRecord, request_hash
from tests.cli_util import pagedgen, read_records, tiny, write_jsonl
from tests.conftest import build_tokenizer
from tests.models.test_models import COMMON, CONFIGS

peft = pytest.importorskip("peft")

ARCHITECTURES = ["llama", "qwen3", "phi3"]  # Phi-3's checkpoints fuse q/k/v and gate/up
SEPARATE = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
FUSED = ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]
PROMPTS = [[5, 9, 200, 31], list(range(40, 63)), [7] * 11]


def make_adapter(base, folder, seed: int, save_embedding_layers="auto", **lora_config):
    """A PEFT adapter with random B (PEFT starts B at zero), saved to folder; the PeftModel."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(base.config, dtype=torch.float32).eval()
    model.load_state_dict(base.state_dict())
    config = peft.LoraConfig(init_lora_weights=False, **lora_config)
    adapted = peft.get_peft_model(model, config).eval()
    adapted.save_pretrained(folder, save_embedding_layers=save_embedding_layers)
    return adapted


def build_adapters(name: str, root):
    """A base model and two adapters: one of rank 8 on q and v (on Phi-3, its fused QKV), one
    of rank 4 on every projection with rsLoRA's scaling."""
    config = AutoConfig.for_model(**dict(COMMON, **CONFIGS[name]))
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    base.save_pretrained(root / "base")
    build_tokenizer(root / "base")
    fused = name == "phi3"
    narrow = ["qkv_proj"] if fused else ["q_proj", "v_proj"]
    models = {
        1: make_adapter(base, root / "a", 1, r=8, lora_alpha=16, target_modules=narrow),
        2: make_adapter(
            base,
            root / "b",
            2,
            r=4,
            lora_alpha=8,
            use_rslora=True,
            target_modules=FUSED if fused else SEPARATE,
        ),
    }
    requests = {1: LoRARequest("a", 1, str(root / "a")), 2: LoRARequest("b", 2, str(root / "b"))}
    return root / "base", base, models, requests


@pytest.fixture(scope="module", params=ARCHITECTURES)
def adapters(request, tmp_path_factory):
    return build_adapters(request.param, tmp_path_factory.mktemp(f"lora-{request.param}"))


@pytest.fixture(scope="module")
def llama_adapters(tmp_path_factory):
    return build_adapters("llama", tmp_path_factory.mktemp("lora-cli"))


def reference(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(
            input_ids=torch.tensor([prompt]),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()


GREEDY = SamplingParams(temperature=0, max_tokens=14, ignore_eos=True)


def run_mixed(llm: LLM, adapters) -> None:
    """Every prompt with the base model and each adapter, all in one batch."""
    _, base, models, requests = adapters
    kinds = [None, 1, 2]
    jobs = [(prompt, kind) for prompt in PROMPTS for kind in kinds]
    loras = [requests[kind] if kind else None for _, kind in jobs]
    outputs = llm.generate([prompt for prompt, _ in jobs], GREEDY, loras)
    for (prompt, kind), output in zip(jobs, outputs):
        expected = reference(models[kind] if kind else base, prompt, GREEDY.max_tokens)
        assert output.outputs[0].token_ids == expected, (prompt, kind)
        assert output.lora_request is (requests[kind] if kind else None)


@pytest.mark.parametrize("mode", ["graphs", "eager", "async"])
def test_each_request_runs_with_its_own_adapter(adapters, mode):
    llm = LLM(
        str(adapters[0]),
        enable_lora=True,
        max_loras=2,
        kv_cache_memory=0.01,
        enforce_eager=mode == "eager",
        async_scheduling=mode == "async",
        log=lambda m: None,
    )
    if llm.engine.runner.backend.name == "cpu" and mode != "eager":
        runner = llm.engine.runner  # steps with adapters and without replay CPU graphs
        assert runner.decode_graphs is not None and runner.lora_decode_graphs is not None
    run_mixed(llm, adapters)


def test_one_slot_runs_the_adapters_in_turn(adapters):
    llm = LLM(str(adapters[0]), enable_lora=True, max_loras=1, kv_cache_memory=0.01)
    run_mixed(llm, adapters)


def test_beam_search_with_an_adapter_equals_peft_generate(llama_adapters):
    """Beams fork with their adapter: with length_penalty 0 and eos ignored, the width best
    cumulative log-probs, as transformers' beam search over the PEFT model keeps them."""
    folder, _, models, requests = llama_adapters
    llm = LLM(str(folder), enable_lora=True, kv_cache_memory=0.01, log=lambda m: None)
    params = BeamSearchParams(beam_width=3, max_tokens=10, ignore_eos=True)
    params.length_penalty = 0.0
    (output,) = llm.beam_search([PROMPTS[0]], params, requests[2])
    with torch.no_grad():
        generated = models[2].generate(
            input_ids=torch.tensor([PROMPTS[0]]),
            num_beams=3,
            num_return_sequences=3,
            max_new_tokens=10,
            do_sample=False,
            length_penalty=0.0,
            eos_token_id=None,
            pad_token_id=0,
        )
    expected = [row[len(PROMPTS[0]) :] for row in generated.tolist()]
    assert [c.token_ids for c in output.outputs] == expected


def test_adapters_past_max_cpu_loras_are_read_again(llama_adapters):
    llm = LLM(str(llama_adapters[0]), enable_lora=True, max_cpu_loras=1, kv_cache_memory=0.01)
    run_mixed(llm, llama_adapters)  # one slot, two adapters: each read again when its turn comes
    manager = llm.engine.runner.lora
    assert len(manager.loaded) == 1 and manager.num_loads >= 3
    with pytest.raises(ValueError, match="max_cpu_loras"):
        LLM(str(llama_adapters[0]), enable_lora=True, max_loras=2, max_cpu_loras=1)


def test_prefix_cache_hits_stay_within_an_adapter(adapters):
    folder, base, models, requests = adapters
    llm = LLM(str(folder), enable_lora=True, max_loras=2, block_size=4, kv_cache_memory=0.01)
    prompt = PROMPTS[1]
    for kind, cached in [(1, 0), (1, 20), (None, 0), (2, 0), (2, 20), (None, 20)]:
        lora = requests[kind] if kind else None
        (output,) = llm.generate([prompt], GREEDY, lora)
        assert output.num_cached_tokens == cached, kind
        expected = reference(models[kind] if kind else base, prompt, GREEDY.max_tokens)
        assert output.outputs[0].token_ids == expected, kind


def test_adapters_pagedgen_cannot_run_are_refused(adapters, tmp_path):
    folder, base, _, requests = adapters
    llm = LLM(str(folder), enable_lora=True, max_lora_rank=4, kv_cache_memory=0.01)
    with pytest.raises(ValueError, match="rank 8, above max_lora_rank"):
        llm.generate([[1, 2]], GREEDY, requests[1])
    make_adapter(base, tmp_path / "head", 3, r=4, target_modules=["lm_head"])
    with pytest.raises(ValueError, match="unsupported tensor .*lm_head"):  # and the whole head
        llm.generate([[1, 2]], GREEDY, LoRARequest("head", 3, str(tmp_path / "head")))
    make_adapter(
        base, tmp_path / "head2", 3, r=4, target_modules=["lm_head"], save_embedding_layers=False
    )
    with pytest.raises(ValueError, match="lm_head, which pagedgen cannot adapt"):
        llm.generate([[1, 2]], GREEDY, LoRARequest("head", 6, str(tmp_path / "head2")))
    make_adapter(base, tmp_path / "dora", 4, r=4, target_modules=["o_proj"], use_dora=True)
    with pytest.raises(ValueError, match="DoRA"):
        llm.generate([[1, 2]], GREEDY, LoRARequest("dora", 4, str(tmp_path / "dora")))
    with pytest.raises(ValueError, match="no adapter_config.json"):
        llm.generate([[1, 2]], GREEDY, LoRARequest("none", 5, str(tmp_path)))
    llm.generate([[1, 2]], GREEDY, requests[2])
    with pytest.raises(ValueError, match="lora_int_id 2 is already"):
        llm.generate([[1, 2]], GREEDY, LoRARequest("other", 2, str(tmp_path / "head")))
    assert not llm.engine.has_unfinished_requests()
    plain = LLM(str(folder), kv_cache_memory=0.01)
    with pytest.raises(ValueError, match="enable_lora"):
        plain.generate([[1, 2]], GREEDY, requests[2])


def sampled_ids(record: dict) -> list[int]:
    """The tokens a record's completion sampled, as its logprobs name them."""
    return [step["token_id"] for step in record["outputs"][0]["logprobs"]]


@pytest.mark.slow
def test_run_takes_adapters_by_name(llama_adapters, tmp_path):
    folder, base, models, requests = llama_adapters
    prompt = PROMPTS[1]
    rows = [
        {"id": "base", "prompt": prompt},
        {"id": "a", "prompt": prompt, "lora": "a"},
        {"id": "b", "prompt": prompt, "lora": "b", "max_tokens": 9},
        {"id": "unknown", "prompt": prompt, "lora": "c"},
        {"id": "typed", "prompt": prompt, "lora": 1},
    ]
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "out.jsonl"
    modules = ["--lora-modules", f"a={requests[1].lora_path}"]
    modules += ["--lora-modules", f"b={requests[2].lora_path}"]
    args = [*tiny(folder, max_tokens=6), "--ignore-eos", "--logprobs", "0", *modules]
    result = pagedgen("run", str(src), "-o", str(out), *args)
    assert result.returncode == 1, result.stderr  # two lines fail alone
    records = {r["id"]: r for r in read_records(out)}
    assert sampled_ids(records["base"]) == reference(base, prompt, 6)
    assert sampled_ids(records["a"]) == reference(models[1], prompt, 6)
    assert sampled_ids(records["b"]) == reference(models[2], prompt, 9)
    assert records["a"]["lora"] == "a" and records["base"]["lora"] is None
    assert "unknown LoRA adapter 'c' (--lora-modules names: a, b)" in records["unknown"]["error"]
    assert "'lora' must be the name of a LoRA adapter" in records["typed"]["error"]

    # OpenAI batch: a body's model picks the adapter it names; any other is a label
    bodies = [("a", "a"), ("base", "gpt-4o-mini")]
    batch = [
        {"custom_id": cid, "url": "/v1/completions", "body": {"model": model, "prompt": prompt}}
        for cid, model in bodies
    ]
    src = write_jsonl(tmp_path / "batch.jsonl", batch)
    out = tmp_path / "batch_out.jsonl"
    result = pagedgen("run", str(src), "-o", str(out), *tiny(folder, 6), "--ignore-eos", *modules)
    assert result.returncode == 0, result.stderr
    bodies = {r["custom_id"]: r["response"]["body"] for r in read_records(out)}
    assert bodies["a"]["model"] == "a" and bodies["base"]["model"] == str(folder)
    texts = {cid: body["choices"][0]["text"] for cid, body in bodies.items()}
    assert texts["a"] == records["a"]["text"] and texts["base"] == records["base"]["text"]
    assert texts["a"] != texts["base"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "modules, message",
    [
        (["--lora-modules", "a"], "NAME=PATH"),
        (["--lora-modules", "a=/nonexistent"], "no adapter_config.json"),
        (["--max-loras", "2"], "need --lora-modules"),
    ],
)
def test_run_refuses_bad_lora_options_before_loading(tiny_llama_path, tmp_path, modules, message):
    src = write_jsonl(tmp_path / "in.jsonl", [{"prompt": "hi"}])
    result = pagedgen("run", str(src), "-o", str(tmp_path / "out.jsonl"), *modules)
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert not (tmp_path / "out.jsonl").exists()


def test_a_lines_adapter_is_part_of_its_request_hash():
    record = InputRecord(1, "x", prompt="hi")
    assert request_hash(record._replace(model="any label")) == request_hash(record)
    assert request_hash(record._replace(lora="a")) != request_hash(record)
