"""Reading protocol JSON bodies field by field, with errors that name the field's full path.

Every reader takes the parent object, the key and the parent's path (`""` for the body root), and
raises `InvalidRequest(field=<path>)` for a wrong type or a missing required value. The HTTP
boundary parses explicitly with these readers; nothing else in the gateway sees raw JSON.
"""

from __future__ import annotations

from typing import Any

from shared.errors import InvalidRequest, Unsupported

MISSING: Any = object()
INT64 = (-(2**63), 2**63 - 1)  # every integer field travels as a protobuf int64


def join(parent: str, key: str | int) -> str:
    """`join("tools", 2) == "tools[2]"`, `join("tools[2]", "name") == "tools[2].name"`."""
    if isinstance(key, int):
        return f"{parent}[{key}]"
    return f"{parent}.{key}" if parent else key


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    return {dict: "object", list: "array", str: "string", bool: "boolean"}.get(
        type(value), "number" if isinstance(value, (int, float)) else type(value).__name__
    )


def wrong_type(path: str, expected: str, value: Any) -> InvalidRequest:
    return InvalidRequest(f"{path} must be {expected}, got {_type_name(value)}", field=path)


def get(obj: dict, key: str, parent: str, *, required: bool = False) -> Any:
    """The raw value of `obj[key]`; MISSING when absent (or null and not required)."""
    value = obj.get(key, MISSING)
    if value is None:
        value = MISSING
    if value is MISSING and required:
        raise InvalidRequest(f"{join(parent, key)} is required", field=join(parent, key))
    return value


def get_str(
    obj: dict, key: str, parent: str, *, required: bool = False, default: Any = None
) -> Any:
    value = get(obj, key, parent, required=required)
    if value is MISSING:
        return default
    if not isinstance(value, str):
        raise wrong_type(join(parent, key), "a string", value)
    return value


def get_bool(obj: dict, key: str, parent: str, *, default: Any = None) -> Any:
    value = get(obj, key, parent)
    if value is MISSING:
        return default
    if not isinstance(value, bool):
        raise wrong_type(join(parent, key), "a boolean", value)
    return value


def get_int(
    obj: dict, key: str, parent: str, *, required: bool = False, default: Any = None
) -> Any:
    value = get(obj, key, parent, required=required)
    if value is MISSING:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise wrong_type(join(parent, key), "an integer", value)
    if not INT64[0] <= value <= INT64[1]:
        path = join(parent, key)
        raise InvalidRequest(f"{path} must be a 64-bit signed integer", field=path)
    return value


def get_number(obj: dict, key: str, parent: str, *, default: Any = None) -> Any:
    value = get(obj, key, parent)
    if value is MISSING:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise wrong_type(join(parent, key), "a number", value)
    try:
        return float(value)
    except OverflowError:
        raise InvalidRequest(f"{join(parent, key)} is out of the range of a double",
                             field=join(parent, key)) from None


def get_ranged(obj: dict, key: str, parent: str, low: float, high: float, *,
               default: float) -> float:
    """A number in [low, high] (the protocol's documented range), else InvalidRequest."""
    value = get_number(obj, key, parent, default=default)
    if not low <= value <= high:
        raise InvalidRequest(f"{join(parent, key)} must be between {low:g} and {high:g}, got "
                             f"{value:g}", field=join(parent, key))
    return value


def get_dict(obj: dict, key: str, parent: str, *, required: bool = False) -> Any:
    value = get(obj, key, parent, required=required)
    if value is MISSING:
        return None
    if not isinstance(value, dict):
        raise wrong_type(join(parent, key), "an object", value)
    return value


def get_list(obj: dict, key: str, parent: str, *, required: bool = False) -> Any:
    value = get(obj, key, parent, required=required)
    if value is MISSING:
        return None
    if not isinstance(value, list):
        raise wrong_type(join(parent, key), "an array", value)
    return value


def as_dict(value: Any, path: str) -> dict:
    if not isinstance(value, dict):
        raise wrong_type(path, "an object", value)
    return value


def stop_strings(obj: dict, key: str, parent: str) -> tuple[str, ...]:
    """A stop field given as one string or a list of strings."""
    value = get(obj, key, parent)
    path = join(parent, key)
    if value is MISSING:
        return ()
    if isinstance(value, str):
        return (value,)
    if not isinstance(value, list):
        raise wrong_type(path, "a string or an array of strings", value)
    for i, item in enumerate(value):
        if not isinstance(item, str) or not item:
            raise wrong_type(join(path, i), "a non-empty string", item)
    return tuple(value)


def text_parts(value: Any, path: str, *, part_types: tuple[str, ...]) -> str:
    """Message content as a string, or a list of text parts `{type: <part_types>, text}` joined."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise wrong_type(path, "a string or an array of content parts", value)
    texts = []
    for i, part in enumerate(value):
        part_path = join(path, i)
        part = as_dict(part, part_path)
        kind = get_str(part, "type", part_path, required=True)
        if kind not in part_types:
            raise Unsupported(
                f"{join(part_path, 'type')} {kind!r} is not supported; this server accepts "
                f"{' and '.join(repr(t) for t in part_types)} parts",
                field=join(part_path, "type"),
            )
        texts.append(get_str(part, "text", part_path, required=True))
    return "".join(texts)


def reject_unless(ok: bool, path: str, message: str) -> None:
    """Raise `Unsupported(field=path)` unless `ok`."""
    if not ok:
        raise Unsupported(message, field=path)
