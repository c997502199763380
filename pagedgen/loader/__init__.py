from pagedgen.loader.file_checks import CheckpointError
from pagedgen.loader.resolve import DEFAULT_MODEL, ModelNotFoundError, ResolvedModel, resolve_model
from pagedgen.loader.weights import load_model

__all__ = [
    "DEFAULT_MODEL",
    "CheckpointError",
    "ModelNotFoundError",
    "ResolvedModel",
    "load_model",
    "resolve_model",
]
