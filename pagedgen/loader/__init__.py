"""Finding a model's files and loading its weights. Finding needs no torch: the CLI resolves a
model before it imports the engine (load_model is pagedgen.loader.weights')."""

from pagedgen.loader.file_checks import CheckpointError
from pagedgen.loader.resolve import DEFAULT_MODEL, ModelNotFoundError, ResolvedModel, resolve_model

__all__ = [
    "DEFAULT_MODEL",
    "CheckpointError",
    "ModelNotFoundError",
    "ResolvedModel",
    "resolve_model",
]
