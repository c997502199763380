"""The extraction workload of the structured output proofs: ShareGPT requests, each to be
described as JSON under one schema (a nested object, an enum, an integer range, a bounded array),
and the check every completion must pass."""

import json

from pagedgen.entrypoints.io.sharegpt import iter_sharegpt_records

EXTRACTION_SCHEMA = {
    "type": "object",
    "properties": {
        "topic": {"type": "string", "maxLength": 60},
        "category": {
            "enum": ["coding", "writing", "math", "science", "business", "advice", "other"]
        },
        "difficulty": {"type": "integer", "minimum": 1, "maximum": 5},
        "keywords": {
            "type": "array",
            "items": {"type": "string", "maxLength": 24},
            "minItems": 1,
            "maxItems": 3,
        },
        "request": {
            "type": "object",
            "properties": {
                "language": {"type": "string", "maxLength": 20},
                "needs_code": {"type": "boolean"},
            },
            "required": ["language", "needs_code"],
            "additionalProperties": False,
        },
    },
    "required": ["topic", "category", "difficulty", "keywords", "request"],
    "additionalProperties": False,
}
# Enough for the longest document the schema allows, at a token per character.
MAX_EXTRACTION_TOKENS = 400
INSTRUCTION = (
    "Describe the request below as JSON: its topic, its category, its difficulty from 1 to 5, "
    "one to three keywords, its language and whether it needs code.\n\nRequest: "
)


def extraction_messages(num_prompts: int, max_chars: int = 600) -> list[list[dict[str, str]]]:
    """One chat per ShareGPT conversation: the instruction and its first human turn."""
    chats = []
    for record in iter_sharegpt_records():
        turns = record.get("conversations") or []
        if not turns or turns[0].get("from") != "human" or not turns[0].get("value", "").strip():
            continue
        text = turns[0]["value"].strip()[:max_chars]
        chats.append([{"role": "user", "content": INSTRUCTION + text}])
        if len(chats) == num_prompts:
            return chats
    raise ValueError(f"ShareGPT holds only {len(chats)} usable prompts, {num_prompts} asked")


def validation_error(text: str, schema: dict = EXTRACTION_SCHEMA) -> str | None:
    """Why a completion is not a JSON document valid under the schema; None if it is."""
    import jsonschema  # the test extra's; imported here so that GPU machines without it collect

    try:
        jsonschema.validate(json.loads(text), schema)
    except (ValueError, jsonschema.ValidationError) as e:
        return f"{type(e).__name__}: {str(e).splitlines()[0]}"
    return None
