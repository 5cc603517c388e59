"""ChatML rendering for the built-in default model, with Hermes-style tool framing.

SmolLM2's own template (in its GGUF) is plain ChatML with a default system prompt when the first
message is not a system message; we render exactly that. Its template has no tool support, so tool
declarations, calls and results are rendered in the Hermes format
(shared/frontends/formats/hermes.py, which the tool grammar and the output decoder use too).
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.errors import InvalidRequest
from shared.frontends.formats import hermes
from shared.generation import ChatMessage, PromptInput

DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True)
class RenderedPrompt:
    text: str  # the whole prompt, special tokens spelled (the tokenizer maps them to ids)
    continuation: str = ""  # the existing final assistant content a continuation extends


def check_messages(messages: tuple[ChatMessage, ...]) -> list[ChatMessage]:
    """The messages as a list; raises InvalidRequest for none or an unknown role (naming it)."""
    if not messages:
        raise InvalidRequest("messages must not be empty", field="messages")
    for i, m in enumerate(messages):
        if m.role not in ROLES:
            raise InvalidRequest(f"messages[{i}].role must be one of {', '.join(ROLES)}, got "
                                 f"{m.role!r}", field=f"messages[{i}].role")
    return list(messages)


def render_chatml(prompt: PromptInput, *, add_generation_prompt: bool = True) -> RenderedPrompt:
    """Render chat messages as SmolLM2's ChatML (raises InvalidRequest naming the bad message)."""
    if prompt.messages is None:
        return RenderedPrompt(prompt.text or "")
    messages = check_messages(prompt.messages)
    parts: list[str] = []
    if messages[0].role == "system":
        system, rest = messages[0].content or "", messages[1:]
    else:
        system, rest = DEFAULT_SYSTEM, messages
    if prompt.tools:
        system += hermes.render_tools_section(prompt.tools)
    parts.append(f"<|im_start|>system\n{system}<|im_end|>\n")
    continuation = ""
    for i, m in enumerate(rest):
        last = i == len(rest) - 1
        if m.role == "system":  # several or late system messages render where they stand
            parts.append(f"<|im_start|>system\n{m.content or ''}<|im_end|>\n")
            continue
        if m.role == "tool":
            body = hermes.render_tool_result(m.content or "")
            parts.append(f"<|im_start|>user\n{body}<|im_end|>\n")
            continue
        content = m.content or ""
        if m.role == "assistant" and m.tool_calls:
            calls = "\n".join(hermes.render_call(c.name, c.arguments_json) for c in m.tool_calls)
            content = f"{content}\n{calls}" if content else calls
        if last and m.role == "assistant" and prompt.continue_final_assistant:
            if m.tool_calls:
                raise InvalidRequest("a continued assistant message must not hold tool calls",
                                     field="messages")
            parts.append(f"<|im_start|>assistant\n{content}")
            continuation = content
            return RenderedPrompt("".join(parts), continuation)
        parts.append(f"<|im_start|>{m.role}\n{content}<|im_end|>\n")
    if prompt.continue_final_assistant:
        raise InvalidRequest("continue_final_assistant needs an assistant message last",
                             field="messages")
    if add_generation_prompt:
        parts.append("<|im_start|>assistant\n")
    return RenderedPrompt("".join(parts))


def messages_from_dicts(items: list[dict]) -> tuple[ChatMessage, ...]:
    """Plain {"role", "content"} dictionaries (the CLI's --messages file) to ChatMessages; an
    assistant turn's `reasoning_content` is its reasoning (the template decides its use)."""
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or not isinstance(item.get("role"), str):
            raise InvalidRequest(f"messages[{i}] needs a string role", field=f"messages[{i}]")
        content = item.get("content")
        if content is not None and not isinstance(content, str):
            raise InvalidRequest(f"messages[{i}].content must be a string",
                                 field=f"messages[{i}].content")
        reasoning = item.get("reasoning_content")
        if reasoning is not None and not isinstance(reasoning, str):
            raise InvalidRequest(f"messages[{i}].reasoning_content must be a string",
                                 field=f"messages[{i}].reasoning_content")
        out.append(ChatMessage(role=item["role"], content=content, reasoning=reasoning))
    return tuple(out)
