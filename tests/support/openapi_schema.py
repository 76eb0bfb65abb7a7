"""A small validator for Kubernetes structural OpenAPI v3 schemas (the subset CRDs use).

Unknown fields are errors (the API server would prune them silently). The ``jsonschema``
package is not a dependency; this covers type, properties, required, enum, items,
additionalProperties, anyOf, pattern, minLength, minimum/maximum and
``x-kubernetes-int-or-string``.
"""

from __future__ import annotations

import re
from typing import Any

TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "boolean": (bool,),
    "integer": (int,),
    "number": (int, float),
}


def errors(value: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """Every way ``value`` breaks ``schema``, as ``path: problem`` lines."""
    if schema.get("x-kubernetes-int-or-string"):
        ok = isinstance(value, (int, str)) and not isinstance(value, bool)
        return [] if ok else [f"{path}: {value!r} is neither int nor string"]
    if "anyOf" in schema and not any(not errors(value, s, path) for s in schema["anyOf"]):
        return [f"{path}: {value!r} matches no anyOf branch"]
    kind = schema.get("type")
    wrong_number = kind in ("integer", "number") and isinstance(value, bool)
    if kind and (not isinstance(value, TYPES[kind]) or wrong_number):
        return [f"{path}: {value!r} is not {kind}"]
    out: list[str] = []
    if "enum" in schema and value not in schema["enum"]:
        out.append(f"{path}: {value!r} not in {schema['enum']}")
    if isinstance(value, str):
        if "pattern" in schema and not re.search(schema["pattern"], value):
            out.append(f"{path}: {value!r} does not match {schema['pattern']}")
        if len(value) < schema.get("minLength", 0):
            out.append(f"{path}: {value!r} is too short")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            out.append(f"{path}: {value} < {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            out.append(f"{path}: {value} > {schema['maximum']}")
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            out += errors(item, schema["items"], f"{path}[{i}]")
    if isinstance(value, dict):
        out += _object(value, schema, path)
    return out


def _object(value: dict[str, Any], schema: dict[str, Any], path: str) -> list[str]:
    out = [f"{path}: missing {k}" for k in schema.get("required", []) if k not in value]
    props, extra = schema.get("properties"), schema.get("additionalProperties")
    for key, item in value.items():
        where = f"{path}.{key}"
        if props is not None and key in props:
            out += errors(item, props[key], where)
        elif isinstance(extra, dict):
            out += errors(item, extra, where)
        elif props is not None or extra is False:
            out.append(f"{where}: unknown field")
    return out
