"""A differential fuzzer: random schemas over the supported keywords, compiled through our path,
against `jsonschema` (Draft202012Validator with its FormatChecker) as the oracle.

The product's promise is that a compiled schema accepts no invalid instance. Each schema either
compiles or is refused typed (UnsupportedSchema / InvalidSchema / ConstraintTooComplex, the first
two with a pointer); every text the grammar accepts, from random walks through its masks and from
adversarial candidates (duplicate names, negated formats and patterns, Unicode line breaks and
escapes, values the two regex readings decide differently), must parse and be valid. The budget
is a few seconds every run; INFERNIX_FUZZ_BUDGET (seconds) makes the slow test a large run.

Schemas compile as content does (`unique_names`: counts of undeclared names compile), and every
walk and acceptance runs with the JSON name companion, as the worker decodes: a text repeating a
member name (after unescaping) is never a valid output, and no walk may reach a dead end (the
companion's masks are exact). Arrays whose uniqueItems the grammar leaves to the unique-items
companion (scalar items it cannot enumerate) run with that companion the same way: a text
repeating an item (JSON equality: 1 and 1.0, strings after unescaping) is never an output.
"""

from __future__ import annotations

import json
import os
import random
import time
import warnings
from functools import lru_cache

import jsonschema
import pytest
import xgrammar as xgr

from services.grammar.engines.matching import accepts, random_walk
from services.grammar.json_names import JsonNameConstraint, JsonNameIndex
from services.grammar.schema import schema_to_grammar
from services.grammar.unique_items import repeats_an_item, unique_items_for
from shared.contract import OutputConstraint
from shared.errors import ConstraintTooComplex, InvalidSchema, UnsupportedSchema
from tests.support.common import byte_domain

CI_BUDGET_S = 4.0

# Strings where readings, formats or JSON escapes are easy to get wrong.
STRINGS = ["", "a", "a\n", "a\n\n", "\na", "é", "٣", "a.", "a@", "@", "xn--ab", "a" * 64,
           "\u2028", "\u2029", "\x85", "\x1c", "\ufeff", "\r", "\t", " ", "\"", "\\", "/",
           "00000000-0000-0000-0000-000000000000", "00000000-0000-0000-0000-000000000000}",
           "PT1H1S", "P1D", "1.2.3.4", "::1", "2020-01-01", "2020-01-01T00:00:00Z",
           "2020-01-01T00:00:00Z\n", "10:00:00Z", "/a~0", "0#", "100#", "http://x.y/z",
           "a:b", "ab", "abc", "x-1", "_", "ü", "😀", "\x00", "a{", "(", "[a-", "a]", "[[a]",
           "a**", "red", "#abc", "Red"]
PATTERNS = ["^a$", ".", "\\d", "\\w", "\\W", "\\s", "^[a-c]+$", "x*", "", "^\\S+$", "a|b$",
            "^(ab)*$", "[^a]", "é", "(^a$)|(^b$)", "a]", "(^[a-c]+$)|^x"]
FORMATS = ["email", "hostname", "uuid", "duration", "ipv4", "ipv6", "date", "date-time", "time",
           "uri", "uri-reference", "json-pointer", "relative-json-pointer", "regex", "color"]
NAMES = ["a", "b", "é", "a\n", "x"]


# Near-misses the reduction reads as what they resemble (misspelt.py): the oracle checks every
# accepted text in both readings, the declared one (annotations) and the author's (`meant`),
# also under complements (bounds.py), and through references to definitions holding them.
MISSPELT = {"minLength": "minLenght", "maxLength": "maxlength", "required": "require",
            "additionalProperties": "additonalProperties", "properties": "properites",
            "type": "Type", "enum": "enume", "minimum": "minimun", "items": "itmes"}
MISSPELT_FORMATS = {"date-time": "datetime", "uri": "url", "hostname": "host-name",
                    "ipv4": "ip-address"}


def random_schema(rng: random.Random, depth: int = 0):
    if depth == 0 and rng.random() < 0.15:  # references into $defs, from anywhere
        refs = {"d": _misspelt(rng, _random_schema(rng, 1), 0.5)}
        root = random_schema(rng, 1)
        use = {"$ref": "#/$defs/d"}
        wrap = rng.choice([{"not": use}, {"oneOf": [use, root]}, {"anyOf": [use, root]},
                           {"if": use, "then": root}, {"allOf": [root, {"not": use}]}])
        return {"$defs": refs, **wrap}
    return _misspelt(rng, _random_schema(rng, depth), 0.15)


def _misspelt(rng: random.Random, schema, rate: float):
    if isinstance(schema, dict) and rng.random() < rate:
        keys = [k for k in schema if k in MISSPELT or
                (k == "format" and schema[k] in MISSPELT_FORMATS)]
        if keys:
            key = rng.choice(keys)
            if key == "format":
                schema = {**schema, "format": MISSPELT_FORMATS[schema["format"]]}
            else:
                schema = {MISSPELT[k] if k == key else k: v for k, v in schema.items()}
    return schema


def _random_schema(rng: random.Random, depth: int = 0):
    kinds = ["string", "pattern", "format", "integer", "number", "const", "enum", "type", "bool"]
    if depth < 2:
        kinds += ["not", "not", "anyOf", "oneOf", "allOf", "if", "object", "object", "array",
                  "not_array", "not_names", "closed_one_of", "all_of_one_of"]
    kind = rng.choice(kinds)
    if kind == "all_of_one_of":  # a oneOf alone in allOf, its discriminator required beside it
        tag = rng.choice(NAMES)
        one = {"oneOf": [{"properties": {tag: {"const": rng.choice(STRINGS + [0, None])},
                                         rng.choice(NAMES): random_schema(rng, depth + 1)}}
                         for _ in range(rng.randint(2, 3))]}
        outer: dict = {"allOf": [one]}
        if rng.random() < 0.8:
            outer["required"] = [tag]
        if rng.random() < 0.5:
            outer["type"] = "object"
        return outer
    if kind == "closed_one_of":  # objects with finitely many names, overlapping (e.g. on {})
        branches = []
        for _ in range(rng.randint(2, 3)):
            names = rng.sample(NAMES, rng.randint(1, 2))
            b: dict = {"type": "object",
                       "properties": {n: random_schema(rng, depth + 1) for n in names}}
            if rng.random() < 0.7:
                b["additionalProperties"] = False
            else:
                b["propertyNames"] = {"enum": names + rng.sample(NAMES, 1)}
                b["additionalProperties"] = random_schema(rng, depth + 1)
            if rng.random() < 0.4:
                b["required"] = names[:1]
            branches.append(b)
        return {"oneOf": branches}
    if kind == "not_array":  # complements by items / contains (some item outside, none inside)
        inner: dict = {"type": "array"} if rng.random() < 0.5 else {}
        for key in rng.sample(["items", "contains"], rng.randint(1, 2)):
            inner[key] = random_schema(rng, depth + 1)
        if rng.random() < 0.3:
            inner["minItems"] = rng.randint(0, 2)
        return {"not": inner}
    if kind == "not_names":  # complements of propertyNames that exclude finitely many names
        excluded = rng.sample(NAMES, rng.randint(1, 2))
        inner = {"propertyNames": {"not": {"enum": excluded} if len(excluded) > 1 else
                                   {"const": excluded[0]}}}
        if rng.random() < 0.4:
            inner["properties"] = {rng.choice(NAMES): random_schema(rng, depth + 1)}
        return {"not": inner, **({"type": "object"} if rng.random() < 0.5 else {})}
    if kind == "bool":
        return rng.random() < 0.7
    if kind == "type":
        return {"type": rng.sample(["null", "boolean", "integer", "number", "string", "array",
                                    "object"], rng.randint(1, 2))}
    if kind == "string":
        s: dict = {"type": "string"}
        if rng.random() < 0.5:
            s["minLength"] = rng.randint(0, 2)
        if rng.random() < 0.5:
            s["maxLength"] = s.get("minLength", 0) + rng.randint(0, 3)
        return s
    if kind == "pattern":
        s = {"pattern": rng.choice(PATTERNS)}
        if rng.random() < 0.6:
            s["type"] = "string"
        return s
    if kind == "format":
        return {"type": "string", "format": rng.choice(FORMATS)}
    if kind == "integer":
        s = {"type": "integer"}
        if rng.random() < 0.6:
            s["minimum"] = rng.randint(-5, 5)
        if rng.random() < 0.4:
            s["multipleOf"] = rng.choice([2, 3, 0.5, 0.1])
        return s
    if kind == "number":
        s = {"type": "number"}
        if rng.random() < 0.5:
            s["exclusiveMinimum"] = rng.choice([0, 0.5, -1])
        if rng.random() < 0.5:
            s["maximum"] = rng.choice([1, 2.5, 100])
        return s
    if kind == "const":
        return {"const": rng.choice(STRINGS + [0, 1.5, None, True, [1], {"a": 1}])}
    if kind == "enum":
        return {"enum": rng.sample(STRINGS + [0, 2, None, False], rng.randint(1, 3))}
    if kind == "not":
        return {"not": random_schema(rng, depth + 1)}
    if kind in ("anyOf", "oneOf", "allOf"):
        return {kind: [random_schema(rng, depth + 1) for _ in range(rng.randint(2, 3))]}
    if kind == "if":
        s = {"if": random_schema(rng, depth + 1)}
        for k in ("then", "else"):
            if rng.random() < 0.7:
                s[k] = random_schema(rng, depth + 1)
        return s
    if kind == "array":
        s = {"type": "array"}
        if rng.random() < 0.7:
            s["items"] = random_schema(rng, depth + 1)
        if rng.random() < 0.3:
            s["prefixItems"] = [random_schema(rng, depth + 1)]
        if rng.random() < 0.3:
            s["contains"] = random_schema(rng, depth + 1)
        if rng.random() < 0.4:
            s["maxItems"] = rng.randint(0, 3)
        if rng.random() < 0.35:
            s["uniqueItems"] = True
            if rng.random() < 0.3:
                s["minItems"] = rng.randint(1, 3)
        return s
    s = {"type": "object"} if rng.random() < 0.8 else {}
    names = rng.sample(NAMES, rng.randint(0, 2))
    if names:
        s["properties"] = {n: random_schema(rng, depth + 1) for n in names}
        if rng.random() < 0.5:
            s["required"] = rng.sample(names, 1)
    r = rng.random()
    if r < 0.2:
        s["additionalProperties"] = False
    elif r < 0.4:
        s["additionalProperties"] = random_schema(rng, depth + 1)
    elif r < 0.55:
        s["patternProperties"] = {rng.choice(PATTERNS[:6]): random_schema(rng, depth + 1)}
    if rng.random() < 0.2:
        s["propertyNames"] = random_schema(rng, depth + 1)
    if rng.random() < 0.25:
        s[rng.choice(["minProperties", "maxProperties"])] = rng.randint(0, 3)
    if rng.random() < 0.15:
        s["dependentRequired"] = {"a": ["b"]}
    if rng.random() < 0.1:  # a draft-07 keyword, enforced in both readings
        s["dependencies"] = {"b": rng.choice([["a"], random_schema(rng, depth + 1)])}
    return s


def candidates(rng: random.Random) -> list[str]:
    """Adversarial texts: scalars, small containers, duplicate names."""
    out = [json.dumps(v, ensure_ascii=False) for v in STRINGS]
    out += ["0", "1", "-1", "2", "1.5", "0.5", "3", "true", "null", "[]", "{}", "[1,1]",
            '["a"]', '[""]']
    # items equal as JSON values, spelled apart (uniqueItems), and items that only look alike
    out += ["[1,1.0]", "[1,1e0]", "[0,-0]", '["a","\\u0061"]', '["a","a"]', '["a","b","a"]',
            '[true,1]', "[null,null]", '[{"a":1,"b":2},{"b":2,"a":1}]', "[[1],[1]]",
            '["\\ud83d\\ude00","😀"]', '["é","\\u00e9"]', "[2,3,2]", '["",""]',
            '{"a":["x","x"]}', '[["a","a"]]']
    for _ in range(24):
        names = [rng.choice(NAMES) for _ in range(rng.randint(1, 3))]
        values = [json.dumps(rng.choice(STRINGS + [0, 1, None]), ensure_ascii=False)
                  for _ in names]
        out.append("{" + ",".join(f"{json.dumps(n, ensure_ascii=False)}:{v}"
                                  for n, v in zip(names, values)) + "}")
    for _ in range(3):  # repeated names, raw and escaped, at the top and nested
        dup = rng.choice(NAMES)
        other = json.dumps(dup, ensure_ascii=rng.random() < 0.5)
        escaped = "".join(f"\\u{ord(c):04x}" for c in dup)
        out.append("{" + f"{json.dumps(dup)}:1,{other}:2" + "}")
        out.append("{" + f'{json.dumps(dup)}:1,"{escaped}":2' + "}")
        out.append("{" + f'"b":null,{json.dumps(dup)}:0,"x":1,{other}:0' + "}")
        out.append("[{" + f"{json.dumps(dup)}:1,{other}:2" + "}]")
        out.append('{"a":{' + f"{json.dumps(dup)}:1,{other}:1" + "}}")
    return out


@lru_cache(maxsize=1)
def _compiler() -> xgr.GrammarCompiler:
    return xgr.GrammarCompiler(byte_domain().tokenizer_info(), max_threads=1, cache_enabled=False)


class _Both:
    """Valid in both readings: the declared one (near-misses and `dependencies` are annotations
    in 2020-12) and the author's (`meant`: each read as the keyword it resembles)."""

    def __init__(self, schema) -> None:
        cls = jsonschema.Draft202012Validator
        self.checks = [cls(schema, format_checker=cls.FORMAT_CHECKER),
                       cls(meant(schema), format_checker=cls.FORMAT_CHECKER)]

    def is_valid(self, value) -> bool:
        return all(c.is_valid(value) for c in self.checks)


_MEANT = {v: k for k, v in MISSPELT.items()}
_MEANT_FORMATS = {v: k for k, v in MISSPELT_FORMATS.items()}


def meant(schema):
    """`schema` as its author meant it: near-misses spelt right, draft-03 and misspelt formats
    as the formats they name, draft-07 `dependencies` as 2020-12's dependentRequired /
    dependentSchemas (values of const and enum kept as they are)."""
    if isinstance(schema, list):
        return [meant(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict = {}
    for k, v in schema.items():
        if k in ("const", "enum"):
            out[k] = v
        elif k == "format" and v in _MEANT_FORMATS:
            out[k] = _MEANT_FORMATS[v]
        elif k == "dependencies":
            for name, dep in v.items():
                key = "dependentRequired" if isinstance(dep, list) else "dependentSchemas"
                out.setdefault(key, {})[name] = meant(dep)
        else:
            out[_MEANT.get(k, k)] = meant(v)
    return out


def _oracle(schema) -> _Both:
    return _Both(schema)


def _valid(check, text: str) -> bool:
    names_repeat = []

    def pairs(items):
        names_repeat.append(len({k for k, _ in items}) != len(items))
        return dict(items)

    try:
        value = json.loads(text, object_pairs_hook=pairs)
    except ValueError:
        return False
    if any(names_repeat):  # no generated object repeats a name
        return False
    try:
        with warnings.catch_warnings():  # re.compile's FutureWarning ("[[a]") is no verdict
            warnings.simplefilter("ignore")
            return check.is_valid(value)
    except Exception:  # noqa: BLE001 - the oracle itself failing (e.g. a format checker bug)
        return False


def fuzz(seed: int, budget_s: float) -> dict:
    """Run schemas from `seed` until `budget_s` seconds pass; returns the counts and the invalid
    accepted instances as (schema, text) pairs."""
    rng = random.Random(seed)
    stats = {"schemas": 0, "compiled": 0, "refused": 0, "texts": 0, "accepted": 0, "bad": []}
    deadline = time.monotonic() + budget_s
    while time.monotonic() < deadline:
        schema = random_schema(rng)
        stats["schemas"] += 1
        try:
            grammar = _compiler().compile_grammar(schema_to_grammar(schema, unique_names=True,
                                                                     unique_items=True))
        except (UnsupportedSchema, InvalidSchema) as exc:
            assert exc.pointer is not None, (schema, exc)
            stats["refused"] += 1
            continue
        except ConstraintTooComplex:
            stats["refused"] += 1
            continue
        stats["compiled"] += 1
        check = _oracle(schema)
        texts = candidates(rng)
        constraint = OutputConstraint.json_schema(schema)
        for _ in range(6):
            walk = random_walk(grammar, byte_domain(), rng, max_tokens=48, end_bias=0.5,
                               names=JsonNameConstraint(JsonNameIndex.of(byte_domain())),
                               items=unique_items_for(constraint, byte_domain()))
            assert not walk.dead_end, (schema, walk.data)
            if walk.completed:
                texts.append(walk.data.decode("utf-8"))
        for t in texts:
            stats["texts"] += 1
            if accepts(grammar, t, byte_domain(), unique_names=True) and \
                    not repeats_an_item(constraint, t.encode("utf-8")):
                stats["accepted"] += 1
                if not _valid(check, t):
                    stats["bad"].append((schema, t))
    return stats


def test_fuzz_no_invalid_instance_accepted():
    """'0 invalid instances accepted by any compiled schema, on a differential fuzzer ... run at
    a CI-sized budget every time'."""
    stats = fuzz(seed=20261201, budget_s=CI_BUDGET_S)
    assert stats["compiled"] > 0 and stats["accepted"] > 0, stats
    assert stats["bad"] == [], stats["bad"][:5]


@pytest.mark.slow
def test_fuzz_large_budget():
    """The same at a large budget, opt-in: INFERNIX_FUZZ_BUDGET seconds (other seeds at the CI
    budget when unset, so CI still adds their coverage)."""
    budget = float(os.environ.get("INFERNIX_FUZZ_BUDGET", CI_BUDGET_S))
    stats = fuzz(seed=int(os.environ.get("INFERNIX_FUZZ_SEED", "7")), budget_s=budget)
    assert stats["compiled"] > 0, stats
    assert stats["bad"] == [], stats["bad"][:5]
