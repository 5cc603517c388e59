"""Differential test of the two constraint engines (docs/constraint-engines.md).

DESIGN.md, "Constraint engines": a second engine is allowed where measured better, "proved
equivalent by differential tests ... Neither engine may make a language looser." For many
generated schemas (and every fixture schema of the schema tests) the xgrammar EBNF and the
llguidance Lark lowering must give identical masks at every position of the same random walks,
agree on may-end, termination and the forced bytes, accept and reject the same instances, and every
completed walk must be valid for the `jsonschema` library (the independent base). Both run as the
product decodes them: with the JSON length companion of the strings the grammar leaves unbounded
(services/grammar/json_lengths.py), which clears the same bits of both masks.
"""

from __future__ import annotations

import json
import random
import zlib
from functools import lru_cache

import numpy as np
import pytest

from services.grammar.compiler import ModelCompiler
from services.grammar.engines.matching import legal_ids
from services.grammar.json_lengths import json_lengths_for
from services.grammar.schema.emit import WHITESPACE_PROFILES
from shared.contract import OutputConstraint
from tests.grammar.test_grammar_schema_walks import CASES, validator
from tests.support.common import byte_domain

_PATTERNS = ["^[a-c]{1,3}$", "^x-[0-9]+$", "q", "^(ab|cd)*$", "^\\d{2}$", "é"]
_WORDS = ["a", "b", "ab", "name", "é", "x\n", "k\"q"]


def random_schema(rng: random.Random, depth: int = 0) -> dict:
    """A schema of the supported subset: objects, arrays, bounded strings and numbers, patterns,
    enums, consts, unions, and (at the top) a recursive definition."""
    kinds = ["string", "integer", "number", "boolean", "null", "enum", "const", "pattern"]
    if depth < 3:
        kinds += ["object", "object", "array", "anyOf"]
    kind = rng.choice(kinds)
    if kind == "string":
        s: dict = {"type": "string"}
        if rng.random() < 0.6:
            lo = rng.randint(0, 3)
            s["minLength"] = lo
            if rng.random() < 0.7:
                s["maxLength"] = lo + rng.randint(0, 4)
        return s
    if kind == "integer":
        s = {"type": "integer"}
        if rng.random() < 0.7:
            lo = rng.randint(-30, 30)
            s.update(minimum=lo, maximum=lo + rng.randint(0, 200))
        return s
    if kind == "number":
        s = {"type": "number"}
        if rng.random() < 0.5:
            s["exclusiveMinimum"] = rng.choice([-2.5, 0, 0.1])
        if rng.random() < 0.5:
            s["maximum"] = rng.choice([3, 10.75, 1e3])
        return s
    if kind in ("boolean", "null"):
        return {"type": kind}
    if kind == "enum":
        return {"enum": rng.sample(["a", "b c", 1, 2.5, None, True, {"k": [1]}, [], "é\"\\"], 3)}
    if kind == "const":
        return {"const": rng.choice(["x", 0, {"a": "b", "c": [None, {}]}, [1, "\n"]])}
    if kind == "pattern":
        return {"type": "string", "pattern": rng.choice(_PATTERNS)}
    if kind == "anyOf":
        return {"anyOf": [random_schema(rng, depth + 1) for _ in range(rng.randint(2, 3))]}
    if kind == "array":
        s = {"type": "array", "items": random_schema(rng, depth + 1)}
        if rng.random() < 0.3:
            s["prefixItems"] = [random_schema(rng, depth + 1) for _ in range(rng.randint(1, 2))]
        if rng.random() < 0.5:
            s["minItems"] = rng.randint(0, 2)
        if rng.random() < 0.5:
            s["maxItems"] = s.get("minItems", 0) + rng.randint(0, 3)
        return s
    names = rng.sample(_WORDS, rng.randint(0, 4))
    s = {"type": "object", "properties": {n: random_schema(rng, depth + 1) for n in names}}
    if names and rng.random() < 0.7:
        s["required"] = rng.sample(names, rng.randint(1, len(names)))
    extra = rng.random()
    if extra < 0.4:
        s["additionalProperties"] = False
    elif extra < 0.6:
        s["additionalProperties"] = random_schema(rng, depth + 1)
    return s


def generated_schemas(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    out = [random_schema(rng) for _ in range(n)]
    out.append({"$defs": {"t": {"type": "object", "properties": {
        "v": {"type": "integer", "minimum": 0, "maximum": 3},
        "kids": {"type": "array", "maxItems": 2, "items": {"$ref": "#/$defs/t"}}},
        "required": ["v"], "additionalProperties": False}}, "$ref": "#/$defs/t"})
    return out


@lru_cache(maxsize=2)
def compiler(name: str = "bytes") -> ModelCompiler:
    if name == "bytes":
        return ModelCompiler(byte_domain())
    from shared.frontends import get_domain

    return ModelCompiler(get_domain(name))


def both(constraint: OutputConstraint, comp: ModelCompiler):
    return (comp.compile(constraint, engine="xgrammar").grammar,
            comp.compile(constraint, engine="llguidance").grammar)


def compare_walks(gx, gl, rng: random.Random, walks: int, steps: int,
                  constraint: OutputConstraint | None = None) -> list[bytes]:
    """Walk both engines' matchers with the same random legal tokens; assert identical masks,
    may-end, termination and forced bytes at every position; roll back now and then and compare
    again. Returns the outputs of the walks that ended with EOS. `constraint`: its length
    companion clears both masks and follows the walk."""
    domain = gx.domain
    done = []
    bx = np.zeros((1, domain.mask_words), dtype=np.int32)
    bl = bx.copy()
    for _ in range(walks):
        mx, ml = gx.matcher(), gl.matcher()
        lengths = None if constraint is None else json_lengths_for(constraint, domain)
        data = bytearray()
        history: list[int] = []
        for _ in range(steps):
            mx.fill_mask(bx)
            ml.fill_mask(bl)
            if lengths is not None:
                lengths.apply(bx[0])
                lengths.apply(bl[0])
            if not np.array_equal(bx, bl):
                a, b = set(legal_ids(bx[0], domain.size)), set(legal_ids(bl[0], domain.size))
                raise AssertionError(f"masks differ after {bytes(data)!r}: only xgrammar "
                                     f"{sorted(a - b)[:8]}, only llguidance {sorted(b - a)[:8]}")
            assert mx.is_completed() == ml.is_completed(), bytes(data)
            assert mx.forced_bytes() == ml.forced_bytes(), bytes(data)
            ids = legal_ids(bx[0], domain.size)
            assert ids, f"dead end after {bytes(data)!r}"
            eos = [i for i in ids if i in domain.eos_ids]
            other = [i for i in ids if i not in domain.eos_ids]
            if history and rng.random() < 0.1:  # an undone step must leave identical states
                n = rng.randint(1, min(3, len(history)))
                mx.rollback(n)
                ml.rollback(n)
                if lengths is not None:
                    lengths.rollback(n)
                for t in history[-n:]:
                    data = data[:len(data) - len(domain.token_bytes[t])]
                del history[-n:]
                continue
            token = eos[0] if eos and (not other or rng.random() < 0.4) else rng.choice(other)
            assert mx.accept_token(token) and ml.accept_token(token), token
            assert lengths is None or lengths.accept(token), token
            assert mx.is_terminated() == ml.is_terminated()
            if token in domain.eos_ids:
                done.append(bytes(data))
                break
            history.append(token)
            data += domain.token_bytes[token]
    return done


def check_schema_both(schema, seed: int, comp: ModelCompiler, walks: int = 6, steps: int = 48,
                      whitespace: str = "any") -> None:
    constraint = OutputConstraint.json_schema(schema, whitespace=whitespace)
    gx, gl = both(constraint, comp)
    rng = random.Random(seed)
    v = validator(schema)
    outputs = compare_walks(gx, gl, rng, walks, steps, constraint)
    for out in outputs:
        instance = json.loads(out)
        assert v.is_valid(instance), (out, schema)
    # instances: the walks' outputs, and their one-byte mutations, accepted alike by both
    for out in outputs[:3]:
        for i in range(0, len(out), max(1, len(out) // 6)):
            for mutated in (
                out[:i] + out[i + 1 :],
                out[:i] + b" " + out[i:],
                out[:i] + b"1" + out[i:],
            ):
                a, b = gx.matcher(), gl.matcher()
                ra = a.accept_bytes(mutated) and a.is_completed()
                rb = b.accept_bytes(mutated) and b.is_completed()
                assert ra == rb, mutated


SCHEMAS = generated_schemas(60, seed=15)


@pytest.mark.parametrize("i", range(len(SCHEMAS)))
def test_generated_schemas_identical_masks(i):
    """Identical masks, may-end, termination and instance decisions on both engines; completed
    walks valid for jsonschema."""
    check_schema_both(SCHEMAS[i], seed=i, comp=compiler())


@pytest.mark.parametrize("name,schema,valid,invalid", CASES, ids=[c[0] for c in CASES])
def test_fixture_schemas_identical(name, schema, valid, invalid):
    """The schema tests' fixtures: identical masks along walks, and both engines accept exactly
    the valid instances of the fixture (jsonschema decided them there)."""
    comp = compiler()
    check_schema_both(schema, seed=zlib.crc32(name.encode()), comp=comp)
    constraint = OutputConstraint.json_schema(schema)
    gx, gl = both(constraint, comp)
    for text, expected in [(t, True) for t in valid] + [(t, False) for t in invalid]:
        for g in (gx, gl):
            m = g.matcher()
            lengths = json_lengths_for(constraint, comp.domain)
            counted = lengths is None or lengths.after_bytes(text.encode()) is not None
            assert (m.accept_bytes(text.encode()) and m.is_completed() and counted) == expected, (
                g.engine,
                text,
            )


@pytest.mark.parametrize("whitespace", WHITESPACE_PROFILES)
@pytest.mark.parametrize("i", range(0, 60, 6))
def test_whitespace_profiles_identical(i, whitespace):
    """Each whitespace profile lowers to the same language on both engines."""
    check_schema_both(SCHEMAS[i], seed=100 + i, comp=compiler(), walks=4, whitespace=whitespace)


@pytest.mark.parametrize("i", [0, 7, 19, 33, 60])
def test_identical_masks_on_a_real_vocabulary(i):
    """The same on SmolLM2's 49,152 byte-level BPE tokens, whose merges cross JSON punctuation,
    escapes and partial UTF-8 in every way the small test vocabulary does not."""
    check_schema_both(SCHEMAS[i], seed=i, comp=compiler("smollm2"), walks=2, steps=40)
