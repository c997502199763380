"""Whether an engine pools (vLLM's runner "pooling": embeddings, or a classifier's scores) and
how its hidden states are pooled (vLLM's PoolerConfig): the engine's pooler_config over the
model's sentence-transformers files over LAST with normalization, vLLM's default for decoder
models; the task (embed, classify) from the checkpoint's architecture."""

import json
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from pagedgen.json_args import json_object

POOLING_TYPES = ("LAST", "MEAN", "CLS")
TASKS = ("embed", "classify")  # vLLM's pooling tasks: LLM.embed, LLM.classify
RUNNERS = ("auto", "generate", "pooling")
# sentence-transformers' 1_Pooling/config.json flags, as vLLM reads them
SENTENCE_TRANSFORMERS_MODES = {
    "pooling_mode_lasttoken": "LAST",
    "pooling_mode_mean_tokens": "MEAN",
    "pooling_mode_cls_token": "CLS",
}


@dataclass(frozen=True, slots=True)
class PoolerConfig:
    """LAST: the prompt's last token's hidden state; MEAN: the mean over its tokens; CLS: its
    first token's. Hidden states are the model's last layer's, after its final norm, as
    transformers' last_hidden_state. A classifier (task "classify") then takes its score
    head's logits. use_activation (vLLM's name, once normalize): an embedding is scaled to unit
    length (L2), a classifier's logits become its scores (softmax, sigmoid: see
    models/classifier.py)."""

    pooling_type: str = "LAST"
    use_activation: bool = True
    task: str = "embed"  # "classify": a classifier's score head, from its architecture

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"task must be one of {TASKS}, got {self.task!r}")
        if self.pooling_type not in POOLING_TYPES:
            raise ValueError(
                f"pooling_type must be one of {POOLING_TYPES}, got {self.pooling_type!r}"
            )
        if not isinstance(self.use_activation, bool):
            raise ValueError(f"use_activation must be true or false, got {self.use_activation!r}")

    @property
    def reads_every_prompt_token(self) -> bool:
        """Whether it needs hidden states a prefix-cache hit would skip."""
        return self.pooling_type != "LAST"


def resolve_pooler_config(
    model_dir: Path | None, overrides: dict[str, Any] | str | None, task: str = "embed"
) -> PoolerConfig:
    """overrides (a dict or its JSON) over the model's sentence-transformers pooling over the
    defaults, for the task its architecture does."""
    overrides = json_object("pooler_config", overrides) or {}
    known = {f.name for f in fields(PoolerConfig)} - {"task"}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ValueError(f"unknown pooler_config keys {unknown}; known: {sorted(known)}")
    found = sentence_transformers_pooling(model_dir) if model_dir is not None else {}
    if isinstance(overrides.get("pooling_type"), str):
        overrides = {**overrides, "pooling_type": overrides["pooling_type"].upper()}
    return replace(PoolerConfig(task=task), **{**found, **overrides})


def sentence_transformers_pooling(model_dir: Path) -> dict[str, Any]:
    """The pooling a sentence-transformers model folder names (modules.json and its Pooling
    module's config.json), as PoolerConfig fields; {} where it names none."""
    modules = _read_json(model_dir / "modules.json")
    if not isinstance(modules, list):
        return {}
    found: dict[str, Any] = {}
    types = [str(module.get("type", "")) for module in modules if isinstance(module, dict)]
    for module in modules:
        if not isinstance(module, dict) or not str(module.get("type", "")).endswith("Pooling"):
            continue
        pooling = _read_json(model_dir / str(module.get("path", "")) / "config.json") or {}
        flags = [k for k, v in pooling.items() if k.startswith("pooling_mode_") and v is True]
        if len(flags) != 1 or flags[0] not in SENTENCE_TRANSFORMERS_MODES:
            raise ValueError(
                f"{model_dir}: pagedgen pools by one of {sorted(SENTENCE_TRANSFORMERS_MODES)}, "
                f"the model's Pooling module by {flags}"
            )
        found["pooling_type"] = SENTENCE_TRANSFORMERS_MODES[flags[0]]
    if types:
        found["use_activation"] = any(t.endswith("Normalize") for t in types)
    return found


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def pooling_task(architectures: list[str]) -> str | None:
    """The pooling task a checkpoint is made for: "embed" for a decoder without its LM head
    (LlamaModel, Qwen3Model, ...), "classify" for a sequence classifier; None for an LM."""
    if any(arch.endswith("ForSequenceClassification") for arch in architectures):
        return "classify"
    bare = [a for a in architectures if a.endswith("Model") and not a.endswith("LMHeadModel")]
    return "embed" if bare else None  # GPT2LMHeadModel has its LM head


def checkpoint_architectures(model_dir: Path) -> list[str]:
    """config.json's architectures, read without loading anything else."""
    data = _read_json(model_dir / "config.json")
    return [str(a) for a in data.get("architectures") or []] if isinstance(data, dict) else []


def pick_pooler_config(
    runner: str, overrides: dict[str, Any] | str | None, model_dir: Path, architectures: list[str]
) -> PoolerConfig | None:
    """How an engine of this runner pools with this checkpoint, or None where it generates."""
    task = task_of(runner, architectures)
    return None if task is None else resolve_pooler_config(model_dir, overrides, task)


def job_task(
    runner: str, model_dir: Path, hf_overrides: dict[str, Any] | None = None
) -> str | None:
    """The pooling task of an engine of this runner over the model folder, known before the
    model loads (from its config.json, or the architectures hf_overrides names); None where it
    generates."""
    architectures = (hf_overrides or {}).get("architectures")
    return task_of(runner, architectures or checkpoint_architectures(model_dir))


def task_of(runner: str, architectures: list[str]) -> str | None:
    """The pooling task of an engine of this runner over these architectures, None where it
    generates: runner "auto" pools with embedding models and classifiers (vLLM's rule), runner
    "pooling" with anything (an LM embeds)."""
    task = pooling_task(architectures)
    if runner == "pooling":
        return task or "embed"
    return task if runner == "auto" else None
