"""A batch job: every record of an input through an LLM, one output line each, resumable.

from pagedgen import LLM
from pagedgen.entrypoints.batch import BatchJob
from pagedgen.entrypoints.io import InputSpec, OutputFile, open_input

output = OutputFile("out.jsonl", resume=True)  # locked: one run per output
job = BatchJob(
    LLM(), open_input(InputSpec("prompts.jsonl")), output,
    sampling={"temperature": 0, "max_tokens": 128},
)
result = job.run()  # JobResult: records written, failures, the summary `pagedgen run` prints
output.close()
"""

from pagedgen.entrypoints.batch.job import BatchJob, JobProgress, JobResult

__all__ = ["BatchJob", "JobProgress", "JobResult"]
