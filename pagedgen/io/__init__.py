"""Inputs (JSONL, OpenAI batch, text, Hugging Face datasets, ShareGPT) read lazily into
InputRecords, and outputs written one complete JSON line at a time, resumable."""

from pagedgen.io.readers import InputSource, open_input
from pagedgen.io.records import InputRecord
from pagedgen.io.resume import OutputFile
from pagedgen.io.spec import InputError, InputSpec

__all__ = ["InputError", "InputRecord", "InputSource", "InputSpec", "OutputFile", "open_input"]
