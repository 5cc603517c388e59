"""ChatML rendering for the built-in default model, with Hermes-style tool framing.

SmolLM2's own template (in its GGUF) is plain ChatML with a default system prompt when the first
message is not a system message; we render exactly that. Its template has no tool support, so tool
declarations are rendered the way the Qwen2.5/Qwen3 family frames them: a `# Tools` section with
one JSON declaration per line inside <tools></tools> in the system turn, assistant calls as
`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, and tool results as a user turn
holding `<tool_response>...</tool_response>`. The tool contract itself (grammar, parser) lives with
the grammar service; this module only renders prompts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from shared.errors import InvalidRequest
from shared.generation import ChatMessage, PromptInput

DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
ROLES = ("system", "user", "assistant", "tool")


def _tools_section(prompt: PromptInput) -> str:
    lines = [
        "",
        "",
        "# Tools",
        "",
        "You can call the functions declared below. Their signatures are JSON Schema documents "
        "inside <tools></tools>:",
        "<tools>",
    ]
    for tool in prompt.tools:
        decl = {"type": "function", "function": {"name": tool.name,
                                                 "description": tool.description or "",
                                                 "parameters": tool.parameters}}
        lines.append(json.dumps(decl, ensure_ascii=False))
    lines += [
        "</tools>",
        "",
        "To call a function, write one JSON object with its name and arguments between "
        "<tool_call></tool_call> tags:",
        "<tool_call>",
        '{"name": <function-name>, "arguments": <arguments-object>}',
        "</tool_call>",
    ]
    return "\n".join(lines)


def render_tool_call(name: str, arguments_json: str) -> str:
    """The canonical text of one call: what the model emits and what history re-renders."""
    args = json.loads(arguments_json) if arguments_json else {}
    body = json.dumps({"name": name, "arguments": args}, ensure_ascii=False)
    return f"{TOOL_CALL_OPEN}\n{body}\n{TOOL_CALL_CLOSE}"


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
        system += _tools_section(prompt)
    parts.append(f"<|im_start|>system\n{system}<|im_end|>\n")
    continuation = ""
    for i, m in enumerate(rest):
        last = i == len(rest) - 1
        if m.role == "system":
            raise InvalidRequest("a system message is only allowed first", field="messages")
        if m.role == "tool":
            body = f"<tool_response>\n{m.content or ''}\n</tool_response>"
            parts.append(f"<|im_start|>user\n{body}<|im_end|>\n")
            continue
        content = m.content or ""
        if m.role == "assistant" and m.tool_calls:
            calls = "\n".join(render_tool_call(c.name, c.arguments_json) for c in m.tool_calls)
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
    """Plain {"role", "content"} dictionaries (the CLI's --messages file) to ChatMessages."""
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or not isinstance(item.get("role"), str):
            raise InvalidRequest(f"messages[{i}] needs a string role", field=f"messages[{i}]")
        content = item.get("content")
        if content is not None and not isinstance(content, str):
            raise InvalidRequest(f"messages[{i}].content must be a string",
                                 field=f"messages[{i}].content")
        out.append(ChatMessage(role=item["role"], content=content))
    return tuple(out)
