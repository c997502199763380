"""pagedgen on Ray Data: the same batch job over the replicas of a Ray cluster.

Needs the extra: pip install 'pagedgen[ray]'.

import ray
from pagedgen.entrypoints.ray import ProcessorConfig, build_processor

config = ProcessorConfig(
    model="HuggingFaceTB/SmolLM2-135M-Instruct",
    engine_kwargs={"max_num_seqs": 64},
    sampling={"temperature": 0, "max_tokens": 128},
    concurrency=2,  # replicas, one LLM each
    batch_size=64,
)
processor = build_processor(
    config,
    preprocess=lambda row: {"messages": [{"role": "user", "content": row["question"]}]},
    postprocess=lambda row: {"question": row["messages"][0]["content"], "answer": row["text"]},
)
ds = processor(ray.data.read_parquet("questions.parquet"))
ds.write_json("answers/")
"""

from pagedgen.entrypoints.ray.config import RAY_MISSING, ProcessorConfig, require_ray
from pagedgen.entrypoints.ray.processor import Processor, build_processor

__all__ = ["RAY_MISSING", "Processor", "ProcessorConfig", "build_processor", "require_ray"]
