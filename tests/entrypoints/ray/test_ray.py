"""pagedgen on Ray Data, on a local 2-CPU cluster with the tiny model: 2 replicas write what a
single process writes, record for record; a replica killed mid-job loses and repeats nothing;
--resume after the driver is killed runs only the rest. Skipped where Ray is not installed."""

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from pagedgen.entrypoints.io import InputSpec, OutputFile, open_input
from pagedgen.sampling_params import SamplingParams
from tests.cli_util import COMMAND, read_records, run_in_process, tiny

NUM_ROWS = 200
TIMING = ("time_to_first_token", "latency")
DUPLICATE_ID_LINE = 31
HAS_RAY = importlib.util.find_spec("ray") is not None
needs_ray = pytest.mark.skipif(not HAS_RAY, reason="Ray is not installed: pip install '.[ray]'")
pytestmark = pytest.mark.slow  # a local Ray cluster and its worker processes


def engine_kwargs() -> dict:
    return {"kv_cache_memory": 0.01, "max_num_seqs": 8}


SAMPLING = {"temperature": 0, "max_tokens": 8}


@pytest.fixture(scope="module")
def cluster():
    if not HAS_RAY:
        pytest.skip("Ray is not installed: pip install '.[ray]'")
    import ray

    os.environ.update(OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")  # the workers' too
    try:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    except Exception:  # a raylet too slow to register on a loaded machine: once more
        ray.shutdown()
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


@pytest.fixture(scope="module")
def rows_file(tmp_path_factory):
    lines = [
        json.dumps({"id": f"r{i}", "prompt": f"row {i} says " * (1 + i % 4)})
        for i in range(NUM_ROWS)
    ]
    lines[10] = "{not json"
    lines[20] = json.dumps({"id": "r20", "prompt": ""})
    lines[DUPLICATE_ID_LINE - 1] = json.dumps({"id": "r1", "prompt": "a duplicate id"})
    lines[40] = json.dumps({"id": "r40", "messages": [{"role": "user", "content": "hi"}]})
    path = tmp_path_factory.mktemp("ray") / "rows.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def reference(tiny_llama_path, rows_file, tmp_path_factory):
    """A single process's records, without their timings, in input order."""
    from pagedgen import LLM
    from pagedgen.entrypoints.batch import BatchJob

    out = OutputFile(str(tmp_path_factory.mktemp("ref") / "out.jsonl"))
    llm = LLM(str(tiny_llama_path), log=lambda _: None, **engine_kwargs())
    BatchJob(llm, open_input(InputSpec(str(rows_file))), out, SAMPLING).run()
    out.close()
    return without_timing(read_records(out.path))


def without_timing(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING} for r in records]


def config(model, concurrency: int = 2, batch_size: int = 8, lora_modules=None):
    from pagedgen.entrypoints.ray import ProcessorConfig

    lora = {"enable_lora": True} if lora_modules else {}
    return ProcessorConfig(
        model=str(model),
        engine_kwargs={**engine_kwargs(), **lora},
        sampling=SAMPLING,
        concurrency=concurrency,
        batch_size=batch_size,
        lora_modules=lora_modules or {},
    )


def make_lora(model, folder) -> str:
    """A rank-4 PEFT adapter of the tiny model, with random B (PEFT starts B at zero)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(3)
    base = AutoModelForCausalLM.from_pretrained(model)
    lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    get_peft_model(base, lora).save_pretrained(folder)
    return str(folder)


def cli_args(model, rows_file, out) -> list[str]:
    return [
        "run", str(rows_file), "-o", str(out), *tiny(model, max_tokens=8), "--max-num-seqs", "8",
        "--ray", "--replicas", "2", "--batch-size", "8",
    ]  # fmt: skip


@needs_ray
def test_two_replicas_write_what_one_process_writes(
    capsys, cluster, tiny_llama_path, rows_file, reference, tmp_path
):
    out = tmp_path / "out.jsonl"
    stats = tmp_path / "stats.json"
    args = [*cli_args(tiny_llama_path, rows_file, out), "--stats-json", str(stats)]
    code, _, err = run_in_process(capsys, *args)
    assert code == 1, err  # the bad rows
    assert without_timing(read_records(out)) == reference
    replicas = json.loads(stats.read_text())["replicas"]
    assert len(replicas) == 2, replicas  # both replicas took rows
    assert sum(r["num_requests"] for r in replicas.values()) == NUM_ROWS - 1  # less the dup id
    assert "pagedgen run --ray" in err and "total" in err


@needs_ray
def test_replicas_embed_what_one_process_embeds(
    capsys, cluster, tiny_llama_path, rows_file, tmp_path
):
    """--runner pooling on Ray: each replica's pooling runner, the same records as BatchJob's
    (error lines in the embedding job's shape, the driver's and the replicas' alike)."""
    from pagedgen import LLM
    from pagedgen.entrypoints.batch import BatchJob

    single = OutputFile(str(tmp_path / "single.jsonl"))
    llm = LLM(str(tiny_llama_path), runner="pooling", log=lambda _: None, **engine_kwargs())
    BatchJob(llm, open_input(InputSpec(str(rows_file))), single).run()
    single.close()
    out = tmp_path / "out.jsonl"
    args = [
        "run", str(rows_file), "-o", str(out), "--model", str(tiny_llama_path), "--runner",
        "pooling", "--kv-cache-memory", "0.01", "--max-num-seqs", "8", "--no-progress", "--ray",
        "--replicas", "2", "--batch-size", "16",
    ]  # fmt: skip
    code, _, err = run_in_process(capsys, *args)
    assert code == 1, err  # the bad rows
    records = without_timing(read_records(out))
    assert records == without_timing(read_records(single.path))
    assert len(records[0]["embedding"]) == 64 and records[10]["embedding"] is None


@needs_ray
def test_a_killed_replica_loses_and_repeats_nothing(cluster, tiny_llama_path, rows_file, reference):
    from pagedgen.entrypoints.ray.job import RayJob

    killed: list[str] = []

    def kill_a_replica(progress) -> None:
        replicas = progress.metrics.replicas
        if not killed and progress.num_done >= NUM_ROWS // 5 and len(replicas) == 2:
            killed.append(next(iter(replicas)))
            os.kill(int(killed[0].rsplit(":", 1)[1]), signal.SIGKILL)

    out = OutputFile(str(rows_file.parent / "killed.jsonl"), overwrite=True)
    job = RayJob(config(tiny_llama_path), open_input(InputSpec(str(rows_file))), out)
    result = job.run(kill_a_replica)
    out.close()
    assert killed and result.num_records == NUM_ROWS and not result.interrupted
    assert without_timing(read_records(out.path)) == reference
    # The killed replica's records that came back count as its own; Ray Data retried the
    # batches it held, on the other replica or on the one it restarts (a new process), which on
    # a loaded machine may start after the other has taken every batch left.
    replicas = result.summary["replicas"]
    assert killed[0] in replicas and len(replicas) in (2, 3), replicas


@needs_ray
def test_resume_after_the_driver_is_killed_runs_only_the_rest(
    capsys, cluster, tiny_llama_path, rows_file, reference, tmp_path
):
    out = tmp_path / "parts"
    args = [*cli_args(tiny_llama_path, rows_file, out), "--output-format", "parts"]
    # os.environ now holds what ray.init set for its cluster (RAY_AUTH_MODE=token)
    command = [*COMMAND, *args, "--ray-address", cluster]
    driver = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    part = out / "part-00000.jsonl"
    deadline = time.monotonic() + 240
    while not (part.exists() and part.read_bytes().count(b"\n") >= NUM_ROWS // 4):
        assert driver.poll() is None, driver.stderr.read().decode()
        assert time.monotonic() < deadline, "the driver made no progress"
        time.sleep(0.05)
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    kept = part.read_bytes().count(b"\n")  # SIGKILL can tear no line: one write() each
    assert kept < NUM_ROWS, "killed too late"

    stats = tmp_path / "stats.json"
    code, _, err = run_in_process(capsys, *args, "--resume", "--stats-json", str(stats))
    assert code == 1, err
    assert f"{kept} records kept" in err
    summary = json.loads(stats.read_text())
    assert summary["num_resumed"] == kept and summary["num_requests"] == NUM_ROWS
    made = sum(r["num_requests"] for r in summary["replicas"].values())
    duplicate_id_left = DUPLICATE_ID_LINE not in {r["line"] for r in read_records(part)}
    assert made == NUM_ROWS - kept - duplicate_id_left  # the rest only (the driver writes dups)

    merged = tmp_path / "merged.jsonl"
    code, _, err = run_in_process(capsys, "merge", str(out), "-o", str(merged))
    assert code == 0, err
    assert without_timing(read_records(merged)) == reference


@needs_ray
def test_processor_completes_dataset_rows(cluster, tiny_llama_path, tmp_path):
    import ray

    from pagedgen import LLM, LoRARequest
    from pagedgen.entrypoints.ray import build_processor

    adapter = make_lora(tiny_llama_path, tmp_path / "adapter")
    processor = build_processor(
        config(tiny_llama_path, concurrency=1, lora_modules={"tuned": adapter}),
        preprocess=lambda row: {
            "q": row["q"],
            "prompt": row["q"].removeprefix("tuned: ").removeprefix("other: "),
            "lora": row["q"].split(": ")[0] if ": " in row["q"] else None,
            "sampling_params": {"n": 1, "logprobs": 1, "prompt_logprobs": 1},
        },
        postprocess=lambda row: {
            "q": row["q"],
            "answer": row["text"],
            "error": row["error"],
            "logprobs": row["outputs"][0]["logprobs"] if row["outputs"] else None,
            "prompt_logprobs": row.get("prompt_logprobs"),
            "prompt_tokens": row["prompt_tokens"],
        },
    )
    # the empty prompt and an unknown adapter: error rows, not failures
    questions = ["what is one", "", "and two", "tuned: and two", "other: and two"]
    rows = processor(ray.data.from_items([{"q": q} for q in questions])).take_all()
    by_question = {row["q"]: row for row in rows}
    assert set(by_question) == set(questions)
    assert by_question[""]["error"] == "the prompt is empty"
    assert by_question[""]["answer"] is None
    assert "unknown LoRA adapter 'other'" in by_question["other: and two"]["error"]
    llm = LLM(str(tiny_llama_path), log=lambda _: None, enable_lora=True, **engine_kwargs())
    tuned = llm.generate("and two", SamplingParams(**SAMPLING), LoRARequest("tuned", 1, adapter))
    assert by_question["tuned: and two"]["answer"] == tuned[0].outputs[0].text
    assert by_question["tuned: and two"]["answer"] != by_question["and two"]["answer"]
    two = by_question["and two"]
    assert isinstance(two["answer"], str) and two["error"] is None
    # entries of fixed keys, not an Arrow column per token id
    prompt_steps = two["prompt_logprobs"]
    assert prompt_steps[0] is None and len(prompt_steps) == two["prompt_tokens"]
    for step in [*prompt_steps[1:], *two["logprobs"]]:
        assert set(step) == {"token_id", "token", "logprob", "rank", "top_logprobs"}
        assert len(step["top_logprobs"]) == 1 and step["top_logprobs"][0]["rank"] == 1


def test_ray_missing_is_a_one_line_usage_error(capsys, tiny_llama_path, rows_file, tmp_path):
    saved = sys.modules.get("ray")
    sys.modules["ray"] = None  # import ray raises ImportError
    try:
        code, _, err = run_in_process(capsys, *cli_args(tiny_llama_path, rows_file, tmp_path / "o"))
    finally:
        if saved is None:
            del sys.modules["ray"]
        else:
            sys.modules["ray"] = saved
    assert code == 2
    assert (
        err.strip() == "error: Ray is not installed; install it with: pip install 'pagedgen[ray]'"
    )


def test_ray_options_need_ray(capsys, tiny_llama_path, rows_file, tmp_path):
    args = ["run", str(rows_file), "-o", str(tmp_path / "o"), *tiny(tiny_llama_path)]
    code, _, err = run_in_process(capsys, *args, "--replicas", "2")
    assert code == 2 and "--replicas needs --ray" in err
