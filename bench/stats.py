"""Summaries shared by our engine's and the reference's rounds."""

from __future__ import annotations

import json
import statistics
from typing import Any


def schemas() -> list[dict]:
    from bench.grammar import SCHEMAS

    return [schema for schema, _ in SCHEMAS]


def p50(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def valid(text: str, schema: dict) -> bool:
    import jsonschema

    try:
        jsonschema.validate(json.loads(text), schema)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def summary(ttft: list[float], tpot: list[float], tokens: list[int], wall: float,
             texts: list[str], schemas: list[dict] | None) -> dict[str, Any]:
    out = {"requests": len(tokens), "output_tokens": sum(tokens), "wall_s": round(wall, 4),
           "ttft_p50_ms": ms(p50(ttft)), "tpot_p50_ms": ms(p50(tpot)),
           "throughput_tok_s": round(sum(tokens) / wall, 2),
           "tokens_per_request": {"min": min(tokens), "max": max(tokens)}}
    if schemas is not None:
        out["valid_json"] = sum(valid(t, schemas[i % len(schemas)]) for i, t in enumerate(texts))
    return out


def ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 4) if a is not None and b else None

