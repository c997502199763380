"""The structured output options of `pagedgen run`: one constraint for every request, checked
before the model loads."""

import json

from pagedgen.sampling_params import StructuredOutputsParams


def structured_outputs_option(
    json_schema: str | None, regex: str | None, choice: str | None
) -> StructuredOutputsParams | None:
    """The constraint of --json-schema FILE, --regex or --choice a,b,c (None: no option given);
    raises ValueError, naming the option, for one that cannot run."""
    given = {"--json-schema": json_schema, "--regex": regex, "--choice": choice}
    names = [name for name, value in given.items() if value is not None]
    if not names:
        return None
    if len(names) > 1:
        raise ValueError(
            f"give one of --json-schema, --regex and --choice, not {' and '.join(names)}"
        )
    name = names[0]
    try:
        if json_schema is not None:
            params = StructuredOutputsParams(json=_read_schema(json_schema))
        elif regex is not None:
            params = StructuredOutputsParams(regex=regex)
        else:
            assert choice is not None
            params = StructuredOutputsParams(choice=choice.split(","))
        from pagedgen.engine.structured_output.backend import check_grammar

        check_grammar(params)
    except (ValueError, ImportError) as e:
        raise ValueError(f"{name}: {e}") from e
    return params


def _read_schema(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise ValueError(f"cannot read {path!r}: {e.strerror}") from e
    try:
        schema = json.loads(text)
    except ValueError as e:
        raise ValueError(f"{path!r} is not JSON: {e}") from e
    if not isinstance(schema, dict):
        raise ValueError(f"{path!r} must hold a JSON schema object")
    return schema
