"""Dict arguments that the command line gives as JSON text."""

import json
from typing import Any


def json_object(name: str, value: dict[str, Any] | str | None) -> dict[str, Any] | None:
    """value as a dict: itself, or parsed from its JSON text; None stays None. Raises ValueError
    naming the argument for text that is not a JSON object."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise ValueError(f"{name} is not valid JSON: {e}") from e
    if value is not None and not isinstance(value, dict):
        raise ValueError(f"{name} must be a JSON object, got {type(value).__name__}")
    return value
