"""A batch job: every record of an input through an LLM, one output line each, resumable.

from pagedgen import LLM
from pagedgen.batch import BatchJob
from pagedgen.io import InputSpec, OutputFile, open_input

job = BatchJob(
    LLM(), open_input(InputSpec("prompts.jsonl")), OutputFile("out.jsonl", resume=True),
    sampling={"temperature": 0, "max_tokens": 128},
)
result = job.run()  # JobResult: records written, failures, the summary `pagedgen run` prints
"""

from pagedgen.batch.job import BatchJob, JobProgress, JobResult

__all__ = ["BatchJob", "JobProgress", "JobResult"]
