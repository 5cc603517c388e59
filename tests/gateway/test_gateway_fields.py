"""Nothing that changes the output is silently ignored (issue 11 §2): documented fields accepted,
unknown ones refused unless the operator opts in, output-changing ones always refused; the
Anthropic `output_format` beta and `structured_outputs` on Responses and Messages; non-strict tool
schemas checked against the meta-schema; each protocol's sampling ranges."""

from __future__ import annotations

import aiohttp
import jsonschema
import openai
import pytest
import pytest_asyncio
from hypothesis import given, settings
from hypothesis import strategies as st

from services.gateway.schema_meta import check_meta_schema
from shared.contract import ConstraintKind
from shared.errors import InvalidSchema
from tests.support.fake_worker import FakeWorker, running_gateway

aio = pytest.mark.asyncio(loop_scope="module")
MODEL = "smollm2"
USER = [{"role": "user", "content": "hi"}]
SCHEMA = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"],
          "additionalProperties": False}
ROUTES = {"chat": "/v1/chat/completions", "completions": "/v1/completions",
          "responses": "/v1/responses", "messages": "/v1/messages"}
BASE = {"chat": {"model": MODEL, "messages": USER},
        "completions": {"model": MODEL, "prompt": "hi"},
        "responses": {"model": MODEL, "input": "hi"},
        "messages": {"model": MODEL, "max_tokens": 8, "messages": USER}}


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def served():
    strict, lenient = FakeWorker(), FakeWorker()
    async with running_gateway(strict) as url, \
            running_gateway(lenient, ignore_unknown_fields=True) as lenient_url:
        async with aiohttp.ClientSession() as http:
            yield {"strict": (strict, url), "lenient": (lenient, lenient_url), "http": http}


@pytest_asyncio.fixture(loop_scope="module")
async def gw(served):
    served["strict"][0].reset()
    served["lenient"][0].reset()
    return served


async def call(gw, protocol: str, extra: dict, *, which: str = "strict") -> tuple[int, dict]:
    worker, url = gw[which]
    async with gw["http"].post(url + ROUTES[protocol], json={**BASE[protocol], **extra}) as r:
        return r.status, await r.json()


def param(payload: dict) -> str | None:
    return payload["error"].get("param")


UNKNOWN = [
    ("chat", {"temprature": 0.5}, "temprature"),
    ("chat", {"messages": [{"role": "user", "content": "hi", "nmae": "x"}]}, "messages[0].nmae"),
    ("chat", {"messages": [{"role": "user", "content": [{"type": "text", "text": "a", "x": 1}]}]},
     "messages[0].content[0].x"),
    ("chat", {"tools": [{"type": "function", "function": {"name": "f", "parameter": {}}}]},
     "tools[0].function.parameter"),
    ("chat", {"response_format": {"type": "json_schema", "json_schema": {
        "name": "s", "schema": SCHEMA, "strictt": True}}}, "response_format.json_schema.strictt"),
    ("completions", {"max_token": 3}, "max_token"),
    ("responses", {"instruction": "be brief"}, "instruction"),
    ("responses", {"input": [{"role": "user", "content": "hi", "extra": 1}]}, "input[0].extra"),
    ("responses", {"text": {"format": {"type": "json_object"}, "verbose": True}}, "text.verbose"),
    ("messages", {"stop_sequence": ["x"]}, "stop_sequence"),
    ("messages", {"messages": [{"role": "user", "content": "hi", "name": "bob"}]},
     "messages[0].name"),
    ("messages", {"tools": [{"name": "f", "input_schema": {"type": "object"}, "schema": {}}]},
     "tools[0].schema"),
]


@aio
@pytest.mark.parametrize("protocol, extra, field", UNKNOWN, ids=[u[2] for u in UNKNOWN])
async def test_unknown_fields_are_400_unless_the_operator_opts_in(gw, protocol, extra, field):
    """Issue 11 §2: "reject other unknown fields with a 400 naming them, unless the operator
    opts into ignoring them (--ignore-unknown-fields)". With the option the request is served
    and the worker sees what it would without the field."""
    status, payload = await call(gw, protocol, extra)
    assert status == 400 and param(payload) == field, payload
    assert gw["strict"][0].requests == []
    status, payload = await call(gw, protocol, extra, which="lenient")
    assert status == 200, payload
    assert len(gw["lenient"][0].requests) == 1


NEVER_IGNORED = [
    ("chat", {"guided_json": SCHEMA}, "guided_json"),
    ("chat", {"guided_regex": "[0-9]+"}, "guided_regex"),
    ("chat", {"top_k": 5}, "top_k"),
    ("completions", {"guided_choice": ["a", "b"]}, "guided_choice"),
    ("responses", {"response_format": {"type": "json_object"}}, "response_format"),
    ("messages", {"response_format": {"type": "json_object"}}, "response_format"),
    ("messages", {"grammar": 'root ::= "a"'}, "grammar"),
]
UNSUPPORTED = [
    ("chat", {"logit_bias": {"42": 10}}, "logit_bias"),
    (
        "chat",
        {"chat_template_kwargs": {"tools_in_user": True}},
        "chat_template_kwargs.tools_in_user",
    ),
    ("chat", {"audio": {"voice": "alloy", "format": "mp3"}}, "audio"),
    ("chat", {"modalities": ["text", "audio"]}, "modalities"),
    (
        "chat",
        {
            "messages": [
                {"role": "assistant", "content": None, "refusal": "no"},
                {"role": "user", "content": "hi"},
            ]
        },
        "messages[0].refusal",
    ),
    ("completions", {"echo": True}, "echo"),
    ("completions", {"best_of": 3}, "best_of"),
    ("completions", {"suffix": "end"}, "suffix"),
    ("responses", {"previous_response_id": "resp_1"}, "previous_response_id"),
    ("responses", {"reasoning": {"effort": "high", "summary": "auto"}}, "reasoning.summary"),
    ("responses", {"include": ["message.output_text.logprobs"],
                   "tools": [{"type": "function", "name": "f", "parameters": {}}]}, "include"),
    # log-probabilities outside the protocols' ranges, or asked for the wrong way
    ("chat", {"top_logprobs": 3}, "top_logprobs"),
    ("chat", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("completions", {"logprobs": 6}, "logprobs"),
    ("responses", {"top_logprobs": -1}, "top_logprobs"),
    ("responses", {"truncation": "auto"}, "truncation"),
    ("responses", {"text": {"verbosity": "low"}}, "text.verbosity"),
    ("messages", {"mcp_servers": [{"type": "url", "url": "http://x", "name": "x"}]}, "mcp_servers"),
    ("messages", {"output_config": {"effort": "low"}}, "output_config.effort"),
    ("messages", {"thinking": {"type": "adaptive"}}, "thinking.type"),
    (
        "messages",
        {
            "messages": [
                {"role": "user", "content": "go"},
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "t",
                            "content": "boom",
                            "is_error": True,
                        }
                    ],
                },
            ]
        },
        "messages[2].content[0].is_error",
    ),
]


@aio
@pytest.mark.parametrize("protocol, extra, field", NEVER_IGNORED + UNSUPPORTED,
                         ids=[u[2] for u in NEVER_IGNORED + UNSUPPORTED])
async def test_output_changing_fields_are_never_ignored(gw, protocol, extra, field):
    """Issue 11 §2: "a field that would change the output language is never ignored": other
    servers' constraint and sampling spellings, and documented fields this server does not
    implement (at a value other than their no-op one), are 400s even with
    ignore_unknown_fields."""
    for which in ("strict", "lenient"):
        status, payload = await call(gw, protocol, extra, which=which)
        assert status == 400 and param(payload) == field, (which, payload)
        assert gw[which][0].requests == []


INERT = [
    ("chat", {"store": True, "metadata": {"k": "v"}, "user": "u1", "service_tier": "auto",
              "prompt_cache_key": "k", "safety_identifier": "s", "logprobs": False,
              "top_logprobs": 0,
              "logit_bias": {}, "stream_options": None, "reasoning_effort": None}),
    ("completions", {"user": "u1", "echo": False, "best_of": 1, "logprobs": None}),
    ("responses", {"store": False, "metadata": {"k": "v"}, "user": "u", "truncation": "disabled",
                   "include": ["reasoning.encrypted_content"], "background": False}),
    ("messages", {"metadata": {"user_id": "u"}, "service_tier": "auto",
                  "cache_control": {"type": "ephemeral"}, "mcp_servers": [],
                  "system": [{"type": "text", "text": "s", "cache_control": {"type": "ephemeral"}}],
                  "thinking": {"type": "disabled"}}),
]


@aio
@pytest.mark.parametrize("protocol, extra", INERT, ids=[i[0] for i in INERT])
async def test_documented_fields_that_cannot_change_the_output_are_accepted(gw, protocol, extra):
    """Issue 11 §2: "accept the documented fields of each protocol (OpenAI's store, metadata,
    user, service_tier, ...)", and output-changing ones at their no-op value."""
    status, payload = await call(gw, protocol, extra)
    assert status == 200, payload


@aio
async def test_an_sdk_round_trip_of_the_reply_is_accepted(gw):
    """A reply appended to the conversation as the SDK returns it (refusal, annotations, audio
    and function_call all null/empty) is a valid next request."""
    worker, url = gw["strict"]
    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="k", max_retries=0) as client:
        first = await client.chat.completions.create(model=MODEL, messages=USER)
        history = USER + [first.choices[0].message.model_dump()]
        await client.chat.completions.create(model=MODEL, messages=history + USER)
        reply = await client.responses.create(model=MODEL, input="hi")
        items = [{"role": "user", "content": "hi"}] + [o.model_dump() for o in reply.output]
        await client.responses.create(model=MODEL, input=items + [{"role": "user", "content": "x"}])
    assert [m.role for m in worker.last.prompt.messages] == ["user", "assistant", "user"]


@aio
async def test_anthropic_output_format_beta_is_a_constraint(gw):
    """Issue 11 §2: Anthropic's earlier `output_format` (structured outputs beta) constrains the
    content like `output_config.format`, never silently; both at once is a conflict."""
    worker = gw["strict"][0]
    fmt = {"type": "json_schema", "schema": SCHEMA}
    status, _ = await call(gw, "messages", {"output_format": fmt})
    assert status == 200
    assert worker.last.options.constraint.kind is ConstraintKind.JSON_SCHEMA
    status, payload = await call(gw, "messages", {"output_format": fmt,
                                                   "output_config": {"format": fmt}})
    assert status == 400 and param(payload) == "output_format"
    status, payload = await call(gw, "messages", {"output_format": {"type": "json_schema"}})
    assert status == 400 and param(payload) == "output_format.schema"


@aio
@pytest.mark.parametrize("protocol, standard", [
    ("responses", {"text": {"format": {"type": "json_object"}}}),
    ("messages", {"output_config": {"format": {"type": "json_schema", "schema": SCHEMA}}}),
])
async def test_structured_outputs_on_responses_and_messages(gw, protocol, standard):
    """Issue 11 §2: `structured_outputs` on /v1/responses (and /v1/messages) is the same
    extension as on chat: it constrains the content, and with a standard format it is a
    conflict (a content constraint has one source)."""
    worker = gw["strict"][0]
    status, _ = await call(gw, protocol, {"structured_outputs": {"regex": "[0-9]{3}"}})
    assert status == 200
    c = worker.last.options.constraint
    assert (c.kind, c.source) == (ConstraintKind.REGEX, "[0-9]{3}")
    status, payload = await call(gw, protocol, {"structured_outputs": {"choice": ["a"]},
                                                **standard})
    assert status == 400 and param(payload) == "structured_outputs"


@aio
@pytest.mark.parametrize("protocol, tools, field", [
    ("chat", [{"type": "function", "function": {"name": "f", "parameters": {"type": "objekt"}}}],
     "tools[0].function.parameters/type"),
    ("responses", [{"type": "function", "name": "f", "strict": False,
                    "parameters": {"type": "object", "properties": {"q": {"minLength": -1}}}}],
     "tools[0].parameters/properties/q/minLength"),
    ("messages", [{"name": "f", "input_schema": {"type": "object", "required": "q"}}],
     "tools[0].input_schema/required"),
])
async def test_non_strict_tool_schemas_are_validated(gw, protocol, tools, field):
    """Issue 11 §2: "Non-strict tool parameters are still validated as JSON Schema
    ({"type": "objekt"} is an InvalidSchema with its path)"; a valid schema with keywords the
    compiler does not enforce is fine for a non-strict tool."""
    status, payload = await call(gw, protocol, {"tools": tools})
    assert status == 400, payload
    assert param(payload) == field
    if protocol != "messages":
        assert payload["error"]["code"] == "invalid_schema"
    valid = {"type": "object", "properties": {"e": {"type": "string", "format": "email"},
                                              "n": {"not": {"type": "null"}}}}
    key = {"chat": None, "responses": "parameters", "messages": "input_schema"}[protocol]
    if key is None:
        tools = [{"type": "function", "function": {"name": "f", "parameters": valid}}]
    else:
        tools = [{**tools[0], key: valid}]
    status, payload = await call(gw, protocol, {"tools": tools})
    assert status == 200, payload


@aio
@pytest.mark.parametrize("protocol, field, ok, bad", [
    ("chat", "temperature", 2.0, 2.01),
    ("chat", "top_p", 1.0, 1.5),
    ("chat", "presence_penalty", -2.0, -2.5),
    ("completions", "temperature", 0.0, -0.1),
    ("responses", "temperature", 1.7, 2.5),
    ("messages", "temperature", 1.0, 1.2),
    ("messages", "top_p", 0.5, 1.01),
])
async def test_sampling_ranges_per_protocol(gw, protocol, field, ok, bad):
    """Issue 11 §2: "Sampling ranges per protocol (OpenAI temperature 0..2, Anthropic 0..1)"."""
    status, _ = await call(gw, protocol, {field: ok})
    assert status == 200
    status, payload = await call(gw, protocol, {field: bad})
    assert status == 400 and param(payload) == field, payload


# ---- the meta-schema check against jsonschema's ----------------------------------------------

_VALID_PATTERNS = ("^a", "[0-9]+", "x|y")
_ANY = st.one_of(st.none(), st.booleans(), st.integers(-2, 3), st.sampled_from([1.5, 2.0, -0.5]),
                 st.sampled_from(["x", "string", "objekt", "#/a", "a#b", "1a"]),
                 st.lists(st.sampled_from(["a", "b", "string", "null", 1]), max_size=3),
                 st.just({}))


def _schemas() -> st.SearchStrategy:
    """Schema-shaped values whose keywords mostly hold what the meta-schema allows (so both
    accepted and refused schemas are common), nested through the applicators."""
    def extend(children: st.SearchStrategy) -> st.SearchStrategy:
        names = st.lists(st.sampled_from(["a", "b", "a"]), max_size=3)
        good = {
            "type": st.sampled_from(["string", "object", "null", ["string", "null"], "objekt",
                                     [], ["a"], ["string", "string"]]),
            "enum": st.lists(_ANY, max_size=3), "const": _ANY, "examples": st.lists(_ANY),
            "required": names, "minLength": st.sampled_from([0, 2, 2.0, 2.5, -1]),
            "maxItems": st.integers(-1, 3), "minimum": st.sampled_from([0, -1.5, 3]),
            "multipleOf": st.sampled_from([2, 0.5, 0, -1]),
            "pattern": st.sampled_from(_VALID_PATTERNS), "format": st.sampled_from(["email", 3]),
            "title": st.sampled_from(["t", 1]), "uniqueItems": st.booleans(),
            "$ref": st.sampled_from(["#/$defs/a", "#"]), "$id": st.sampled_from(["x", "a#", "a#b"]),
            "$anchor": st.sampled_from(["a1", "1a", "_x"]),
            "dependentRequired": st.dictionaries(st.just("a"), names, max_size=1),
            "dependencies": st.dictionaries(st.just("a"), names | children, max_size=1),
            "deprecated": st.booleans(), "additionalItems": children, "x-custom": _ANY,
            "properties": st.dictionaries(st.sampled_from(["a", "b"]), children, max_size=2),
            "$defs": st.dictionaries(st.just("a"), children, max_size=1),
            "patternProperties": st.dictionaries(st.sampled_from(_VALID_PATTERNS), children,
                                                 max_size=1),
            "items": children | st.lists(children, max_size=2),
            "prefixItems": st.lists(children, max_size=2), "anyOf": st.lists(children, max_size=2),
            "not": children,
        }
        keys = st.lists(st.sampled_from(sorted(good)), unique=True, max_size=3)
        return keys.flatmap(lambda ks: st.fixed_dictionaries(
            {k: st.one_of(good[k], good[k], good[k], _ANY, children) for k in ks}))
    inner = st.recursive(st.booleans() | st.just({}), extend, max_leaves=8)
    return extend(inner)  # the root is always a keyword object


@settings(max_examples=400, deadline=None, database=None)
@given(_schemas(), st.sampled_from([None, "https://json-schema.org/draft/2020-12/schema",
                                    "http://json-schema.org/draft-07/schema#"]))
def test_meta_schema_check_agrees_with_jsonschema(schema, dialect):
    """The gateway's meta-schema check accepts exactly the schemas `jsonschema`'s
    `check_schema` (an independent implementation of the same meta-schemas) accepts."""
    if dialect is not None and isinstance(schema, dict):
        schema = {"$schema": dialect, **schema}
    oracle = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        oracle.check_schema(schema)
        expected = True
    except jsonschema.SchemaError:
        expected = False
    try:
        check_meta_schema(schema, tool_index=0, tool_name="f")
        ours = True
    except InvalidSchema:
        ours = False
    assert ours == expected, schema
