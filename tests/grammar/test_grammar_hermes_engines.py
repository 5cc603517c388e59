"""Hermes tool grammars on llguidance, against the xgrammar grammar of record.

DESIGN.md, "Constraint engines": "the choice is made per compiled grammar by a written rule,
proved equivalent by differential tests, and nothing outside the grammar service knows which
engine runs. Neither engine may make a language looser." Every tool grammar the product builds
(auto / required / named, parallel or not, the JSON-or-tools union, json_object content, the
thinking framing around it) compiled both ways on a small vocabulary whose merges span the
envelope's lexeme boundaries: identical masks at every position of walks that follow a valid
output for a while and then go random (rollbacks included), the same completion and termination,
and the same verdict on valid, truncated and adversarial texts (wrong names, extra keys, strings
at and past their bound, escapes, a spelled opener inside free text).
"""

from __future__ import annotations

import json
import random
from functools import lru_cache

import numpy as np
import pytest

from services.grammar.compiler import Framed, ModelCompiler, choose_engine, framed_engine
from services.grammar.engines.engine import LLGUIDANCE, XGRAMMAR
from services.grammar.engines.matching import legal_ids
from services.grammar.tools.hermes import ToolSpec
from shared.contract import OutputConstraint, ToolChoice, ToolDefinition, ToolMode
from shared.frontends.token_domain import TokenDomain

THINKING = "qwen-think-v1+hermes-v1"
_MERGES = (b"<tool_call>", b"\n<tool_call>\n", b'{"name": "', b'", "arguments": ', b'{"', b'":',
           b'", "', b'"}', b"}}", b"}\n</tool_call>", b"}\n</tool_call>\n<tool", b"</tool_call>",
           b"get", b"get_all", b'"text', b"ab", b"\\\"", b"\\u00", b"\xc3\xa9", b"\xe6\x97", b"  ",
           b"\n", b"\n\n", b"12", b"<tool", b"_call>", b"</think>")
NOTE = {"type": "object", "properties": {"text": {"type": "string", "maxLength": 70},
                                          "tag": {"type": "string", "minLength": 1,
                                                  "maxLength": 3}},
        "required": ["text"], "additionalProperties": False}
COUNT = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99},
                                           "flag": {"type": "boolean"}}}
TOOLS = (ToolDefinition.create("get", NOTE, strict=True),
         ToolDefinition.create("get_all", COUNT),  # non-strict: any object unless forced
         ToolDefinition.create("ping"))
ANSWER = {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 8}},
          "required": ["answer"], "additionalProperties": False}
SPECS = {
    "auto": ToolSpec(TOOLS, ToolChoice()),
    "auto-single": ToolSpec(TOOLS, ToolChoice(parallel=False)),
    "required": ToolSpec(TOOLS, ToolChoice(ToolMode.REQUIRED)),
    "required-single": ToolSpec(TOOLS, ToolChoice(ToolMode.REQUIRED, parallel=False)),
    "named": ToolSpec(TOOLS, ToolChoice.named("get_all")),
    "union": ToolSpec(TOOLS, ToolChoice(), OutputConstraint.json_schema(ANSWER)),
    "union-object": ToolSpec(TOOLS, ToolChoice(parallel=False), OutputConstraint.json_object()),
    "required-content": ToolSpec(TOOLS, ToolChoice(ToolMode.REQUIRED),
                                 OutputConstraint.json_schema(ANSWER)),
}
FRAMED = ("auto", "named", "union")  # also compiled after the thinking framing


@lru_cache(maxsize=1)
def domain() -> TokenDomain:
    """Every byte, envelope-spanning merges, EOS, the thinking controls, padding."""
    tokens = [bytes([b]) for b in range(256)] + list(_MERGES)
    special = []
    ids: dict[str, set[int]] = {"eos": set(), "control": set()}
    for spelling, kind in ((b"<eos>", "eos"), (b"<think>", "control"), (b"</think>", "control")):
        ids[kind].add(len(tokens))
        special.append((spelling.decode(), len(tokens)))
        tokens.append(spelling)
    return TokenDomain(name="hermes-test", token_bytes=tuple(tokens), size=len(tokens) + 5,
                       eos_ids=frozenset(ids["eos"]), control_ids=frozenset(ids["control"]),
                       special_names=tuple(special))


@lru_cache(maxsize=None)
def _pair(name: str, framing: str | None = None):
    compiler = ModelCompiler(domain())
    source = SPECS[name] if framing is None else Framed(SPECS[name], framing)
    return (compiler.compile(source, engine=XGRAMMAR).grammar,
            compiler.compile(source, engine=LLGUIDANCE).grammar)


def _call(name: str, args: object) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(args)}}}\n</tool_call>'


def _texts() -> list[str]:
    """Valid, truncated and adversarial outputs over the specs' tools."""
    long = "x" * 70
    calls = [_call("get", {"text": "hi"}), _call("get", {"text": long}),
             _call("get", {"text": long + "y"}), _call("get", {"text": 'a"b\\c\u00e9\n'}),
             _call("get", {"text": "t", "tag": "abc"}), _call("get", {"text": "t", "tag": ""}),
             _call("get", {"text": "t", "tag": "abcd"}), _call("get", {"text": "t", "x": 1}),
             _call("get", {"tag": "a", "text": "t"}), _call("get", {}), _call("get_all", {}),
             _call("get_all", {"n": 5, "flag": True}), _call("get_all", {"n": 500}),
             _call("get_all", {"other": [1, {"a": None}]}), _call("ping", {}),
             _call("ping", {"z": "q"}), _call("pong", {}), _call("get_al", {}),
             '<tool_call>\n{"name": "get", "arguments": {"text":"t"}}\n</tool_call>',
             '<tool_call>\n{"name": "get", "arguments": { "text" : "t" }}\n</tool_call>',
             '<tool_call>\n{"name":"get", "arguments": {"text": "t"}}\n</tool_call>',
             '<tool_call>\n{"name": "get", "arguments": {"text": "\\u0041"}}\n</tool_call>',
             '<tool_call>\n{"name": "get", "arguments": {"text": "\\u001f"}}\n</tool_call>']
    out = ["", "Hello there.", "see <tool", "see <tool_call", "a <tool_call> b", "\u00e9\u65e5",
           '{"answer": "yes"}', '{"answer": "123456789"}', '{"answer": "yes"} ', "{}", '{"a": 1}',
           '{"answer":"y"}' + calls[0]]
    for c in calls:
        out += [c, c[:-1], c[: len(c) // 2], "Sure. " + c, c + "\n", c + "\n" + c,
                c + "\n" + calls[0], c + " trailing", c + "\n<tool_call>"]
    return out


@pytest.mark.parametrize("name", sorted(SPECS))
def test_hermes_acceptance_is_identical_on_both_engines(name):
    """Same verdict (a prefix of the language; a complete output) for every probe text."""
    xg, ll = _pair(name)
    for text in _texts():
        data = text.encode()
        a, b = xg.matcher(), ll.matcher()
        assert a.accept_bytes(data) == b.accept_bytes(data), (name, text)
        assert a.is_completed() == b.is_completed(), (name, text)


def _walks(xg, ll, seed: int, targets: list[str], start: list[int]) -> None:
    """Walk both matchers with the same tokens: the `start` ids, then the bytes of a target for a
    random length, then random legal tokens (rollbacks of 1-3 now and then); masks, completion
    and termination compared at every position."""
    dom = domain()
    rng = random.Random(seed)
    buf = np.zeros((2, dom.mask_words), dtype=np.int32)
    for walk in range(10):
        a, b = xg.matcher(), ll.matcher()
        target = rng.choice(targets).encode()
        follow = list(start) + list(target[: rng.randint(0, len(target))])
        pos = 0
        for step in range(60 + len(follow)):
            a.fill_mask(buf, 0)
            b.fill_mask(buf, 1)
            ids = legal_ids(buf[0], dom.size)
            assert ids == legal_ids(buf[1], dom.size), (walk, step, follow[:step])
            assert a.is_completed() == b.is_completed() and a.is_terminated() == b.is_terminated()
            if not ids:
                break
            token = follow[pos] if pos < len(follow) else rng.choice(ids)
            if pos < len(follow) and token not in ids:
                break  # the target left the language (an adversarial target)
            assert a.accept_token(token) == b.accept_token(token) is True
            pos += 1
            if token in dom.eos_ids:
                break
            k = rng.randint(1, 3)
            if pos > len(follow) + k and rng.random() < 0.15:
                a.rollback(k)
                b.rollback(k)
                pos -= k


def _targets() -> list[str]:
    long = "ab\u00e9 " * 18
    return ["I will call. " + _call("get", {"text": long[:70], "tag": "ab"}),
            _call("get", {"text": 'q"\\\n'}) + "\n" + _call("get_all", {"n": 7}),
            _call("get_all", {"n": 12, "flag": False}), _call("ping", {}),
            '{"answer": "ab\u00e9"}', "text <tool text"]


@pytest.mark.parametrize("name", sorted(SPECS))
def test_hermes_masks_are_identical_on_both_engines(name):
    """Identical masks along walks through free text, the envelope, the arguments (a string at
    its bound among them) and the content."""
    xg, ll = _pair(name)
    _walks(xg, ll, sorted(SPECS).index(name), _targets(), [])


@pytest.mark.parametrize("name", FRAMED)
def test_thinking_framed_hermes_masks_are_identical_on_both_engines(name):
    """The thinking framing ("any token except </think>, then the </think> token and exactly the
    separator \\n\\n") around a Hermes tool grammar: identical masks after a short reasoning."""
    xg, ll = _pair(name, THINKING)
    close = domain().special_id("</think>")
    _walks(xg, ll, 100 + FRAMED.index(name), ["\n\n" + t for t in _targets()],
           [ord("o"), ord("k"), close])


def test_the_rule_puts_hermes_tool_grammars_on_llguidance():
    """The written rule (docs/constraint-engines.md): a Hermes tool spec, bare or after the
    thinking framing, compiles on llguidance; the Qwen XML format stays on xgrammar; a schema
    form only the xgrammar emission writes puts the whole tool grammar on xgrammar."""
    spec = SPECS["auto"]
    assert choose_engine(spec) == LLGUIDANCE
    assert framed_engine(spec, THINKING) == LLGUIDANCE
    assert framed_engine(spec, "qwen-xml-v1") == XGRAMMAR
    compiler = ModelCompiler(domain())
    assert compiler.compile(spec).grammar.engine == LLGUIDANCE
    assert compiler.compile(Framed(spec, THINKING)).grammar.engine == LLGUIDANCE
    unique = {"type": "object", "properties": {"v": {"type": "array", "items": {"enum": ["a", "b"]},
                                                    "uniqueItems": True}},
              "additionalProperties": False}
    xgr_only = ToolSpec((ToolDefinition.create("u", unique, strict=True),), ToolChoice())
    assert compiler.compile(xgr_only).grammar.engine == XGRAMMAR


def test_hermes_masks_on_the_built_in_vocabulary():
    """SmolLM2's 49,152 tokens (the built-in model's vocabulary, Hermes its tool format): the
    JSON-or-tools-free `auto` grammar and a named call, walked along the model's own tokenization
    of a call (free text, the envelope, a string near its bound) then randomly: identical masks."""
    from shared.frontends import get_domain
    from shared.frontends.smollm2 import smollm2_tokenizer

    dom = get_domain("smollm2")
    compiler = ModelCompiler(dom)
    encode = smollm2_tokenizer().encode
    texts = ["Let me note it. " + _call("get", {"text": "the quick brown \u00e9 fox " * 2}),
             _call("get_all", {"n": 12, "flag": True})]
    rng = random.Random(3)
    buf = np.zeros((2, dom.mask_words), dtype=np.int32)
    for spec in (SPECS["auto"], SPECS["named"]):
        pair = [compiler.compile(spec, engine=e).grammar for e in (XGRAMMAR, LLGUIDANCE)]
        for text in texts:
            a, b = (g.matcher() for g in pair)
            follow = encode(text).ids
            for step in range(len(follow) + 8):
                a.fill_mask(buf, 0)
                b.fill_mask(buf, 1)
                ids = legal_ids(buf[0], dom.size)
                assert ids == legal_ids(buf[1], dom.size), (text, step)
                if not ids or (step < len(follow) and follow[step] not in ids):
                    break
                token = follow[step] if step < len(follow) else rng.choice(ids)
                assert a.accept_token(token) == b.accept_token(token) is True
                if token in dom.eos_ids:
                    break


def test_tool_names_of_any_letters_are_the_same_literal_on_both_engines():
    """A tool name is 1-128 letters, digits, '_', '-' or '.' (Unicode letters among them, astral
    ones too): the call's head accepts that name exactly, on both engines."""
    compiler = ModelCompiler(domain())
    for name in ("caf\u00e9", "\U0001d400x", "a.b-c_d", "\u65e5\u672c"):
        spec = ToolSpec((ToolDefinition.create(name, {"type": "object"}),), ToolChoice())
        pair = [compiler.compile(spec, engine=e).grammar for e in (XGRAMMAR, LLGUIDANCE)]
        for called, valid in ((name, True), (name + "x", False), (name[:-1], False)):
            data = _call(called, {}).encode()
            for grammar in pair:
                m = grammar.matcher()
                assert (m.accept_bytes(data) and m.is_completed()) is valid, (name, called)
