"""The CLI with models it cannot run, or cannot run some lines of: an unsupported architecture
fails in one line before the tokenizer and weights load and leaves no output; `messages` lines for
a model without a chat template fail one by one."""

from transformers import AutoConfig, AutoModelForCausalLM

from tests.cli_util import read_records, run_in_process, tiny, write_jsonl
from tests.conftest import build_tokenizer


def test_unsupported_architecture_fails_fast_and_leaves_no_output(tmp_path, capsys):
    config = AutoConfig.for_model("mamba", num_hidden_layers=1, hidden_size=16, vocab_size=257)
    config.save_pretrained(tmp_path / "mamba")  # no weights, no tokenizer
    src = write_jsonl(tmp_path / "in.jsonl", [{"prompt": "hello"}])
    out = tmp_path / "out.jsonl"
    code, _, stderr = run_in_process(
        capsys, "run", str(src), "-o", str(out), *tiny(tmp_path / "mamba")
    )
    assert code != 0 and "Traceback" not in stderr, stderr[-2000:]
    assert "unsupported architecture" in stderr and "Gemma2ForCausalLM" in stderr
    assert not out.exists()


def test_messages_without_a_chat_template_fail_per_line(tmp_path, capsys):
    config = AutoConfig.for_model(
        "llama", vocab_size=257, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, eos_token_id=256, bos_token_id=256,
    )  # fmt: skip
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "m")
    build_tokenizer(tmp_path / "m")  # no chat template
    rows = [
        {"id": "a", "messages": [{"role": "user", "content": "hi"}]},
        {"id": "b", "prompt": "plain"},
        {"id": "c", "messages": [{"role": "user", "content": "again"}]},
    ]
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "out.jsonl"
    code, _, stderr = run_in_process(capsys, "run", str(src), "-o", str(out), *tiny(tmp_path / "m"))
    assert "Traceback" not in stderr, stderr[-2000:]
    records = {r["id"]: r for r in read_records(out)}
    assert records["b"]["error"] is None
    for key in ("a", "c"):
        assert "no chat template" in records[key]["error"]
