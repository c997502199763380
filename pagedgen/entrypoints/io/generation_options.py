"""The options an output was generated under, kept beside it (`OUT.options.json`; a parts folder's
`options.json`) so that --resume refuses to add records made under other ones: a file nothing
else reads, which leaves every output format (OpenAI batch responses included) as it is."""

import contextlib
import dataclasses
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from pagedgen.entrypoints.io.spec import InputError

OPTIONS_SUFFIX = ".options.json"
PARTS_OPTIONS_NAME = "options.json"
_VERSION = 1


@dataclasses.dataclass(frozen=True, slots=True)
class GenerationOptions:
    """The options that change what a run generates, by their command-line name, in order."""

    options: dict[str, Any]

    def __post_init__(self) -> None:
        plain = json.loads(json.dumps(self.options, default=_plain))
        object.__setattr__(self, "options", plain)

    @property
    def digest(self) -> str:
        text = json.dumps(self.options, sort_keys=True, separators=(",", ":"))
        return "sha256:" + hashlib.sha256(text.encode()).hexdigest()

    def first_difference(self, before: dict[str, Any]) -> tuple[str, Any, Any] | None:
        """The first option whose value differs from before's: (name, before's, this one's)."""
        missing = object()
        for name in [*self.options, *(n for n in before if n not in self.options)]:
            old, new = before.get(name, missing), self.options.get(name, missing)
            if old != new:
                return name, None if old is missing else old, None if new is missing else new
        return None


def options_path(output: str) -> str:
    """Where the options of the output file are kept."""
    return output + OPTIONS_SUFFIX


def check_resumed_options(path: str, output: str, options: GenerationOptions) -> str | None:
    """Raises InputError if the options kept at path differ from these; returns a note where
    none are kept (an output of pagedgen before the options were kept), else None."""
    try:
        with open(path, encoding="utf-8") as f:
            kept = json.load(f)
    except FileNotFoundError:
        return (
            f"note: {output!r} holds no record of the options it was generated with (an older "
            "pagedgen wrote it); resuming it with these"
        )
    except (OSError, ValueError) as e:
        reason = e.strerror if isinstance(e, OSError) else "not JSON"
        raise InputError(f"cannot read the options of {output!r} in {path!r}: {reason}") from e
    before = kept.get("options") if isinstance(kept, dict) else None
    if not isinstance(before, dict):
        raise InputError(f"{path!r} holds no options of {output!r}; resume it or --overwrite")
    if kept.get("digest") == options.digest:
        return None
    difference = options.first_difference(before)
    if difference is None:  # the same options, kept by a pagedgen that digested them otherwise
        return None
    name, old, new = difference
    raise InputError(
        f"{output!r} was generated with {name} {_shown(old)}, this run has {_shown(new)}; "
        "resume with the options that made it, or --overwrite"
    )


def write_options(path: str, options: GenerationOptions) -> None:
    """Writes the options to path whole (a temporary file renamed over it); raises OSError."""
    text = json.dumps(
        {"version": _VERSION, "digest": options.digest, "options": options.options}, indent=2
    )
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def check_options_writable(path: str, output: str) -> None:
    """Raises InputError unless the options can be kept at path."""
    folder = os.path.dirname(path) or "."
    if not os.access(folder, os.W_OK):  # the options are replaced whole, by a rename
        raise InputError(
            f"cannot write output {output!r}: its options file {path!r} cannot be written "
            f"(folder {folder!r} is not writable)"
        )


def _shown(value: Any, limit: int = 60) -> str:
    """A value in a one-line message: its JSON, elided past limit characters (a template)."""
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {k: v for k, v in dataclasses.asdict(value).items() if v is not None}
    if isinstance(value, set | frozenset):
        return sorted(value, key=str)
    if isinstance(value, Path):
        return str(value)
    return str(value)
