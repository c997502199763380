"""Inputs (JSONL, OpenAI batch, text, Hugging Face datasets, ShareGPT) read lazily into
InputRecords, and outputs written one complete JSON line at a time, resumable."""

from pagedgen.entrypoints.io.output_file import OutputFile
from pagedgen.entrypoints.io.readers import InputSource, open_input
from pagedgen.entrypoints.io.records import InputRecord
from pagedgen.entrypoints.io.resume import resume_source
from pagedgen.entrypoints.io.spec import InputError, InputSpec
from pagedgen.entrypoints.io.writer import OutputWriteError

__all__ = [
    "InputError",
    "InputRecord",
    "InputSource",
    "InputSpec",
    "OutputFile",
    "OutputWriteError",
    "open_input",
    "resume_source",
]
