"""What running on Ray Data costs, on this machine, against one process on the same prompts:

    python benchmarks/ray_overhead.py [num_prompts] [max_tokens] [threads] [repeats]

Runs the same greedy batch job (SmolLM2, pagedgen's default model) three ways, each model on
`threads` torch threads (1 by default: on a shared machine a spinning second OpenMP thread
costs more than it gives): the local batch job in this process; `run --ray`'s job with 1
replica; and with 2 replicas, on a local cluster started once (not timed). Every engine runs
at most BATCH_SIZE sequences, the rows a replica takes at a time, so that the comparison is of
the paths alone; the local and 1-replica runs alternate `repeats` times (the best counts).

Prints, for each, the wall clock with and without loading the model, requests/s and output
tokens/s, the ratio of the 1-replica run to the local one (the Ray path's overhead), and each
replica's throughput over its busy time. Checks that every run wrote the same records.
"""

import json
import os
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from pagedgen import LLM
from pagedgen.entrypoints.batch import BatchJob
from pagedgen.entrypoints.io import InputSpec, OutputFile, open_input
from pagedgen.entrypoints.ray import ProcessorConfig
from pagedgen.entrypoints.ray.job import RayJob

TOPICS = ["the sea", "a city at night", "bread", "a old clock", "rain", "mountains", "a library"]
TIMING = ("time_to_first_token", "latency")
BATCH_SIZE = 64


def write_prompts(path: Path, num_prompts: int) -> None:
    with path.open("w") as f:
        for i in range(num_prompts):
            topic = TOPICS[i % len(TOPICS)]
            words = " and ".join([topic] * (1 + i % 3))
            message = {"role": "user", "content": f"Write a few lines about {words} (#{i})."}
            f.write(json.dumps({"id": f"p{i}", "messages": [message]}) + "\n")


def records(path: str) -> list[dict]:
    lines = Path(path).read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k not in TIMING} for line in lines]


def local_run(prompts: Path, out: Path, sampling: dict, threads: int) -> dict:
    start = time.perf_counter()
    llm = LLM(log=lambda _: None, num_threads=threads, max_num_seqs=BATCH_SIZE)
    loaded = time.perf_counter()
    output = OutputFile(str(out), overwrite=True)
    result = BatchJob(llm, open_input(InputSpec(str(prompts))), output, sampling).run()
    output.close()
    end = time.perf_counter()
    tokens = result.summary["num_output_tokens"]
    return {"wall_s": end - start, "run_s": end - loaded, "tokens": tokens, "replicas": {}}


def ray_run(prompts: Path, out: Path, sampling: dict, replicas: int, threads: int) -> dict:
    config = ProcessorConfig(
        engine_kwargs={"max_num_seqs": BATCH_SIZE},
        sampling=sampling,
        concurrency=replicas,
        batch_size=BATCH_SIZE,
        num_cpus=threads,
    )
    output = OutputFile(str(out), overwrite=True)
    start = time.perf_counter()
    job = RayJob(config, open_input(InputSpec(str(prompts))), output)
    result = job.run()
    end = time.perf_counter()
    output.close()
    summary = result.summary
    return {
        "wall_s": end - start,
        # generation alone, as the replicas timed it: the slowest replica's busy time
        "run_s": max(r["busy_s"] for r in summary["replicas"].values()),
        "tokens": summary["num_output_tokens"],
        "replicas": summary["replicas"],
    }


def main() -> None:
    num_prompts = int(sys.argv[1]) if len(sys.argv) > 1 else 128
    max_tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 32
    threads = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    repeats = int(sys.argv[4]) if len(sys.argv) > 4 else 2
    cpus = os.cpu_count() or 1
    sampling = {"temperature": 0, "max_tokens": max_tokens}
    if os.environ.get("OMP_NUM_THREADS") != str(threads):
        # OpenMP sizes its pool as torch loads: set it before then, here as in Ray's workers
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        os.execve(sys.executable, [sys.executable, *sys.argv], env)
    console = Console()
    import ray

    ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    folder = Path(tempfile.mkdtemp(prefix="ray-overhead-"))
    prompts = folder / "prompts.jsonl"
    write_prompts(prompts, num_prompts)
    local, ray1 = [], []
    for _ in range(repeats):
        local.append(local_run(prompts, folder / "local.jsonl", sampling, threads))
        ray1.append(ray_run(prompts, folder / "ray1.jsonl", sampling, 1, threads))
    runs = {
        "local, 1 process": min(local, key=lambda r: r["run_s"]),
        "Ray, 1 replica": min(ray1, key=lambda r: r["run_s"]),
        "Ray, 2 replicas": ray_run(prompts, folder / "ray2.jsonl", sampling, 2, threads),
    }
    console.print("local runs without loading, s:", [round(r["run_s"], 1) for r in local])
    console.print(
        "1-replica runs, the replica's busy time, s:", [round(r["run_s"], 1) for r in ray1]
    )
    ray.shutdown()
    same = records(folder / "local.jsonl") == records(folder / "ray1.jsonl")
    same = same and records(folder / "local.jsonl") == records(folder / "ray2.jsonl")

    base = runs["local, 1 process"]
    title = (
        f"{num_prompts} prompts, max_tokens {max_tokens}, {threads} thread(s) a model, {cpus} CPUs"
    )
    table = Table(title=title)
    for column in ("run", "wall s", "without loading s", "req/s", "out tok/s", "x local"):
        table.add_column(column, justify="left" if column == "run" else "right")
    for name, r in runs.items():
        table.add_row(
            name,
            f"{r['wall_s']:.1f}",
            f"{r['run_s']:.1f}",
            f"{num_prompts / r['run_s']:.2f}",
            f"{r['tokens'] / r['run_s']:.1f}",
            f"{base['run_s'] / r['run_s']:.3f}",
        )
    console.print(table)
    overhead = runs["Ray, 1 replica"]["run_s"] / base["run_s"] - 1
    console.print(f"Ray path overhead at 1 replica (without loading): {overhead:+.1%}")
    wall = runs["Ray, 1 replica"]["wall_s"] / base["wall_s"] - 1
    console.print(f"Ray path overhead at 1 replica (wall clock, loading included): {wall:+.1%}")
    for name, stats in runs["Ray, 2 replicas"]["replicas"].items():
        console.print(
            f"2 replicas: {name}: {stats['num_requests']} requests, "
            f"{stats['output_tokens_per_s']:.1f} output tok/s over {stats['busy_s']:.1f} s busy"
        )
    console.print(f"same records in all three runs: {same}")


if __name__ == "__main__":
    main()
