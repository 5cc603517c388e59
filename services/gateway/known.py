"""Which fields each protocol object may carry, and what happens to the others.

Every object the gateway reads is checked against its `Shape`:

- `handled`: fields the gateway translates;
- `inert`: documented fields that cannot change the output (bookkeeping, caching hints, service
  tiers): accepted and not used;
- `neutral`: documented fields that would change the output and are not implemented: accepted
  only at their no-op value (absent, null, false, empty, the protocol default), otherwise an
  `Unsupported` 400 naming the field, whatever the operator chose;
- anything else is unknown: an `InvalidRequest` 400 naming it (as OpenAI and Anthropic answer
  unknown fields), unless the operator opted into ignoring unknown fields
  (`FieldPolicy(ignore_unknown_fields=True)`, the CLI's `--ignore-unknown-fields`). A field in
  `NEVER_IGNORED` (another server's constraint or sampling spelling, which would change the output
  language or distribution) is refused even then.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from services.gateway.fields import join
from shared.errors import InvalidRequest, Unsupported

Neutral = Callable[[Any], bool]


def absent(value: Any) -> bool:
    return value is None


def falsy(value: Any) -> bool:
    return value is None or value is False


def empty(value: Any) -> bool:
    return value is None or value == [] or value == {}


def equals(*allowed: Any) -> Neutral:
    return lambda value: value is None or any(value == a and type(value) is type(a)
                                              for a in allowed)


_CONSTRAINT_HINT = "Infernix constrains output through the protocol's own fields or the " \
                   "structured_outputs extension ({grammar | regex | choice})"
_SAMPLING_HINT = "this protocol has no such sampling field here"
# Other servers' spellings of constraints and sampling controls: ignoring one would change the
# output language or distribution without telling the client, so they are never ignored.
NEVER_IGNORED: Mapping[str, str] = {
    **{name: _CONSTRAINT_HINT for name in (
        "guided_json", "guided_regex", "guided_choice", "guided_grammar", "guided_json_object",
        "guided_decoding_backend", "guided_whitespace_pattern", "grammar", "json_schema", "regex",
        "choice", "ebnf", "format", "response_format", "output_format", "output_config",
        "structured_output", "structuredOutputs", "json_mode", "logits_processors")},
    **{name: _SAMPLING_HINT for name in (
        "top_k", "min_p", "typical_p", "repetition_penalty", "ignore_eos", "min_tokens",
        "stop_token_ids", "bad_words", "allowed_token_ids", "logit_bias", "mirostat")},
}


@dataclass(frozen=True)
class Shape:
    """The documented fields of one protocol object (see the module docstring)."""

    name: str  # how errors call the object: "an OpenAI Chat request", "a chat message"
    handled: frozenset[str]
    inert: frozenset[str] = frozenset()
    neutral: Mapping[str, Neutral] = field(default_factory=dict)
    why: Mapping[str, str] = field(default_factory=dict)  # neutral field -> why it is refused


def shape(name: str, handled: str, inert: str = "", why: Mapping[str, str] | None = None,
          **neutral: Neutral) -> Shape:
    return Shape(name, frozenset(handled.split()), frozenset(inert.split()), neutral, why or {})


@dataclass(frozen=True)
class FieldPolicy:
    """How the gateway treats fields no protocol documents. `ignore_unknown_fields` (default
    False): accept and ignore them instead of answering 400 (fields in NEVER_IGNORED and
    documented output-changing fields are refused regardless)."""

    ignore_unknown_fields: bool = False

    def check(self, obj: dict, path: str, of: Shape) -> None:
        """Raise Unsupported / InvalidRequest (field = the offending field's path)."""
        for key, value in obj.items():
            if key in of.handled or key in of.inert:
                continue
            at = join(path, key)
            neutral = of.neutral.get(key)
            if neutral is not None:
                if not neutral(value):
                    why = of.why.get(key, "ignoring it would change the output; leave it out")
                    raise Unsupported(f"{at} is not supported by this server: {why}", field=at)
                continue
            hint = NEVER_IGNORED.get(key)
            if hint is None and self.ignore_unknown_fields:
                continue
            raise InvalidRequest(f"{at} is not a field of {of.name}" +
                                 (f"; {hint}" if hint else ""), field=at)


# ---- OpenAI Chat Completions --------------------------------------------------------------------

CHAT = shape(
    "an OpenAI Chat Completions request",
    "messages model frequency_penalty presence_penalty max_completion_tokens max_tokens n "
    "parallel_tool_calls response_format seed stop stream stream_options temperature tool_choice "
    "tools top_p structured_outputs reasoning_effort chat_template_kwargs thinking_budget "
    "continue_final_message logprobs top_logprobs",
    "metadata store user safety_identifier service_tier prompt_cache_key prompt_cache_options "
    "prompt_cache_retention prediction",
    audio=absent, modalities=equals(["text"]), logit_bias=empty, verbosity=absent,
    web_search_options=absent, functions=empty, function_call=absent, moderation=absent)
CHAT_MESSAGE = {
    "system": shape("a system message", "role content name"),
    "developer": shape("a developer message", "role content name"),
    "user": shape("a user message", "role content name"),
    "assistant": shape("an assistant message",
                       "role content name tool_calls reasoning_content reasoning", "annotations",
                       refusal=absent, audio=absent, function_call=absent),
    "tool": shape("a tool message", "role content tool_call_id"),
}
CHAT_TEXT_PART = shape("a text content part", "type text")
CHAT_TOOL_CALL = shape("a tool call", "id type function")
CHAT_CALLED_FUNCTION = shape("a called function", "name arguments")
CHAT_TOOL = shape("a tool", "type function")
CHAT_FUNCTION = shape("a function definition", "name description parameters strict")
CHAT_RESPONSE_FORMAT = shape("a response_format", "type json_schema")
CHAT_JSON_SCHEMA = shape("a json_schema response format", "name description schema strict")
CHAT_TOOL_CHOICE = shape("a tool_choice", "type function allowed_tools")
CHAT_STREAM_OPTIONS = shape("stream_options", "include_usage", "include_obfuscation")
CHAT_TEMPLATE_KWARGS = shape("chat_template_kwargs", "enable_thinking")

# ---- OpenAI Completions (legacy) ----------------------------------------------------------------

COMPLETIONS = shape(
    "an OpenAI Completions request",
    "model prompt frequency_penalty max_tokens n presence_penalty seed stop stream stream_options "
    "temperature top_p structured_outputs logprobs",
    "user",
    why={"best_of": "best_of must be 1; use n for several choices",
         "echo": "echo is not supported", "suffix": "suffix (insertion) is not supported"},
    best_of=equals(1), echo=falsy, logit_bias=empty, suffix=absent)

# ---- OpenAI Responses ---------------------------------------------------------------------------

_STATELESS = "this server stores no responses; send the whole conversation as input"

RESPONSES = shape(
    "an OpenAI Responses request",
    "model input instructions max_output_tokens parallel_tool_calls stream temperature text "
    "tool_choice tools top_p structured_outputs include truncation reasoning thinking_budget "
    "top_logprobs",
    "metadata store user safety_identifier service_tier prompt_cache_key prompt_cache_options "
    "prompt_cache_retention stream_options",
    why={"previous_response_id": _STATELESS, "conversation": _STATELESS,
         "background": "responses run in the foreground only"},
    background=falsy, background_options=absent, conversation=absent,
    previous_response_id=absent, prompt=absent, context_management=absent, image=absent,
    max_tool_calls=absent, moderation=absent, access_programs=absent)
RESPONSES_MESSAGE = shape("a message input item", "type role content", "id status phase")
# `async_` is how the SDK's model_dump() spells `async` (a reply item sent back as a dict).
RESPONSES_CALL = shape("a function_call input item", "type call_id name arguments", "id status",
                       caller=absent, namespace=absent, **{"async": falsy, "async_": falsy})
RESPONSES_CALL_OUTPUT = shape("a function_call_output input item", "type call_id output",
                              "id status")
RESPONSES_REASONING_ITEM = shape("a reasoning input item", "type content summary",
                                 "id status encrypted_content")
RESPONSES_REASONING_PART = shape("a reasoning content part", "type text")
_SUMMARY = "reasoning summaries are not produced; the reasoning text itself is published"
RESPONSES_REASONING = shape("a reasoning configuration", "effort",
                            why={"summary": _SUMMARY, "generate_summary": _SUMMARY},
                            summary=absent, generate_summary=absent)
RESPONSES_TEXT_PART = shape("a text content part", "type text", "annotations logprobs")
RESPONSES_TOOL = shape("a function tool", "type name description parameters strict")
RESPONSES_TEXT = shape("a text configuration", "format", verbosity=absent)
RESPONSES_FORMAT = shape("a text.format", "type name description schema strict")
RESPONSES_TOOL_CHOICE = shape("a tool_choice", "type name mode tools")
# include values that only concern tools and features this server does not have: harmless.
RESPONSES_INCLUDE_INERT = frozenset({
    "reasoning.encrypted_content", "file_search_call.results", "web_search_call.results",
    "web_search_call.action.sources", "code_interpreter_call.outputs",
    "computer_call_output.output.image_url", "message.input_image.image_url"})

# ---- Anthropic Messages -------------------------------------------------------------------------

MESSAGES = shape(
    "an Anthropic Messages request",
    "model messages max_tokens system stop_sequences stream temperature top_p top_k tools "
    "tool_choice thinking output_config output_format structured_outputs",
    "metadata service_tier cache_control inference_geo speed diagnostics",
    why={"container": "no code execution container here",
         "mcp_servers": "MCP servers are not supported; declare the tools instead"},
    container=absent, context_management=absent, mcp_servers=empty)
MESSAGES_MESSAGE = shape("a message", "role content")
MESSAGES_TEXT = shape("a text block", "type text", "cache_control citations")
MESSAGES_TOOL_USE = shape("a tool_use block", "type id name input", "cache_control")
MESSAGES_TOOL_RESULT = shape(
    "a tool_result block", "type tool_use_id content", "cache_control",
    why={"is_error": "the model's template has no way to mark a tool error; say so in content"},
    is_error=falsy)
MESSAGES_THINKING = shape("a thinking block", "type thinking signature data")
MESSAGES_TOOL = shape("a tool", "type name description input_schema strict",
                      "cache_control eager_input_streaming", input_examples=empty,
                      defer_loading=falsy, allowed_callers=absent)
MESSAGES_TOOL_CHOICE = shape("a tool_choice", "type name disable_parallel_tool_use")
MESSAGES_OUTPUT_CONFIG = shape("output_config", "format", effort=absent)
MESSAGES_FORMAT = shape("an output format", "type schema")
MESSAGES_THINKING_CONFIG = shape("a thinking configuration", "type budget_tokens", "display")
