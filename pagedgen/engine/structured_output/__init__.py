"""Structured output: completions constrained to a JSON schema, a regex, a choice or a grammar.

The grammar engine is llguidance (the `structured` extra). The manager compiles each distinct
constraint once, on a worker thread, keeps one matcher per sequence, and builds the allowed-token
bitmask of every step's sampled rows; the model runner applies it to the logits before sampling.
"""

import importlib.util

INSTALL_HINT = "structured output needs llguidance: pip install 'pagedgen[structured]'"


def is_backend_installed() -> bool:
    return importlib.util.find_spec("llguidance") is not None


def require_backend() -> None:
    """Raises ImportError, naming the install, when llguidance is missing."""
    if not is_backend_installed():
        raise ImportError(INSTALL_HINT)
