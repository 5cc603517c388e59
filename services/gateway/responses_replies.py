"""OpenAI Responses replies: output items, the `response` object and the streamed event
sequence of finished (or streaming) generations."""

from __future__ import annotations

import secrets
import time
from typing import Any

from services.gateway.choices import Results
from services.gateway.cut_calls import is_cut
from services.gateway.logprobs import content_entries
from services.gateway.sse import SSE
from services.gateway.translate import Translated
from shared.errors import InternalError
from shared.generation import (
    Finished,
    FinishReason,
    ReasoningDelta,
    TextDelta,
    TokenLogprobs,
    ToolCallArgumentsDelta,
    ToolCallStart,
)


def _item_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def _message_item(item_id: str, text: str, status: str,
                  logprobs: list | None = None) -> dict[str, Any]:
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": [_text_part(text, logprobs)]}


def _text_part(text: str, logprobs: list | None = None) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}


def _reasoning_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    """A reasoning output item: the reasoning text itself as its content (no summary)."""
    return {"type": "reasoning", "id": item_id, "summary": [], "status": status,
            "content": [{"type": "reasoning_text", "text": text}]}


def _call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict:
    return {"type": "function_call", "id": item_id, "call_id": call_id, "name": name,
            "arguments": arguments, "status": status}


def response_object(tr: Translated, created: float, status: str, output: list[dict],
                    results: Results | None = None, error: dict | None = None) -> dict:
    """The `response` object in the given status."""
    obj: dict[str, Any] = {
        "id": tr.request.request_id, "object": "response", "created_at": created,
        "status": status, "error": error, "incomplete_details": None, "model": tr.request.model,
        "output": output, **tr.echo,
        "usage": None,
    }
    # The resource's other required members (Open Responses), at what this stateless server
    # does: nothing stored or chained, no truncation, no background runs.
    sampling = tr.request.options.sampling
    for name, value in (("completed_at", int(time.time()) if status == "completed" else None),
                        ("previous_response_id", None), ("truncation", "disabled"),
                        ("presence_penalty", sampling.presence_penalty),
                        ("frequency_penalty", sampling.frequency_penalty),
                        ("top_logprobs", 0), ("user", None), ("max_tool_calls", None),
                        ("store", False), ("background", False), ("service_tier", "default"),
                        ("safety_identifier", None), ("prompt_cache_key", None)):
        obj.setdefault(name, value)
    if results is not None:
        finished = results.first
        obj["usage"] = {"input_tokens": results.prompt_tokens,
                        "output_tokens": results.completion_tokens,
                        "total_tokens": results.prompt_tokens + results.completion_tokens,
                        "input_tokens_details": {"cached_tokens": results.cached_tokens},
                        "output_tokens_details": {"reasoning_tokens": results.reasoning_tokens}}
        if finished.finish_reason is FinishReason.LENGTH:
            obj["incomplete_details"] = {"reason": "max_output_tokens"}
        obj["infernix"] = {"constraint": finished.constraint}
    return obj


def _status(finished: Finished) -> str:
    return "incomplete" if finished.finish_reason is FinishReason.LENGTH else "completed"


def aggregate(tr: Translated, results: Results, created: int) -> dict[str, Any]:
    """The response object of a finished generation."""
    finished = results.first
    status = _status(finished)
    output = []
    if finished.reasoning:  # incomplete when the output was cut while still reasoning
        cut = status == "incomplete" and not finished.content and not finished.tool_calls
        output.append(_reasoning_item(_item_id("rs"), finished.reasoning,
                                      "incomplete" if cut else "completed"))
    if finished.content or not finished.tool_calls:
        output.append(_message_item(_item_id("msg"), finished.content, status,
                                    content_entries(finished.logprobs or ())))
    output += [_call_item(_item_id("fc"), c.id, c.name, c.arguments_json,
                          "incomplete" if is_cut(c) else "completed") for c in finished.tool_calls]
    return response_object(tr, created, status, output, results)


class Streamer:
    """The Responses event sequence, each event with its sequence_number. Log-probability
    entries ride on the next output_text delta (stop strings may hold text back); what is left
    when the message closes goes out on one empty delta before its done events, so the deltas'
    `logprobs` concatenate to the message part's (Responses refuses logprobs with tools, so
    every entry belongs to the message)."""

    def __init__(self, tr: Translated) -> None:
        self.tr = tr
        self.created = int(time.time())
        self.seq = 0
        self.output: list[dict] = []  # finished items, in output order
        self.open: dict | None = None  # the item being streamed
        self.text = ""  # accumulated text or arguments of the open item
        self.held: list = []  # log-probability entries not yet sent
        self.sent: list[dict] = []  # the open message's entries sent so far

    def _ev(self, kind: str, **data: Any) -> SSE:
        ev = SSE({"type": kind, "sequence_number": self.seq, **data}, event=kind)
        self.seq += 1
        return ev

    def begin(self, counts: Any = None) -> list[SSE]:
        obj = response_object(self.tr, self.created, "in_progress", [])
        return [self._ev("response.created", response=obj),
                self._ev("response.in_progress", response=obj)]

    def _close(self, status: str = "completed") -> list[SSE]:
        item, self.open = self.open, None
        if item is None:
            return []
        index = len(self.output)
        if item["type"] == "reasoning":
            done = _reasoning_item(item["id"], self.text, status)
            events = [
                self._ev("response.reasoning_text.done", item_id=item["id"], output_index=index,
                         content_index=0, text=self.text),
                self._ev("response.content_part.done", item_id=item["id"], output_index=index,
                         content_index=0, part=done["content"][0])]
        elif item["type"] == "message":
            events = [self._delta(item["id"], index, "")] if self.held else []
            logprobs, self.sent = self.sent, []
            part = _text_part(self.text, logprobs)
            done = _message_item(item["id"], self.text, status, logprobs)
            events += [
                self._ev("response.output_text.done", item_id=item["id"], output_index=index,
                         content_index=0, text=self.text, logprobs=logprobs),
                self._ev("response.content_part.done", item_id=item["id"], output_index=index,
                         content_index=0, part=part)]
        else:
            done = _call_item(item["id"], item["call_id"], item["name"], self.text, status)
            events = [self._ev("response.function_call_arguments.done", item_id=item["id"],
                               output_index=index, name=item["name"], arguments=self.text)]
        self.output.append(done)
        return events + [self._ev("response.output_item.done", output_index=index, item=done)]

    def _delta(self, item_id: str, index: int, text: str) -> SSE:
        entries, self.held = content_entries(self.held), []
        self.sent += entries
        return self._ev("response.output_text.delta", item_id=item_id, output_index=index,
                        content_index=0, delta=text, logprobs=entries)

    def event(self, event: Any, choice: int = 0) -> list[SSE]:
        index = len(self.output)
        out: list[SSE] = []
        if isinstance(event, ReasoningDelta):
            if not event.text:
                return []
            if self.open is None or self.open["type"] != "reasoning":
                out += self._close()
                index = len(self.output)
                self.open, self.text = _reasoning_item(_item_id("rs"), "", "in_progress"), ""
                self.open["content"] = []
                out += [self._ev("response.output_item.added", output_index=index, item=self.open),
                        self._ev("response.content_part.added", item_id=self.open["id"],
                                 output_index=index, content_index=0,
                                 part={"type": "reasoning_text", "text": ""})]
            self.text += event.text
            out.append(self._ev("response.reasoning_text.delta", item_id=self.open["id"],
                                output_index=index, content_index=0, delta=event.text))
        elif isinstance(event, TextDelta):
            if not event.text:
                return []
            if self.open is None or self.open["type"] != "message":
                out += self._close()
                index = len(self.output)
                self.open, self.text = _message_item(_item_id("msg"), "", "in_progress"), ""
                self.open["content"] = []
                out += [self._ev("response.output_item.added", output_index=index, item=self.open),
                        self._ev("response.content_part.added", item_id=self.open["id"],
                                 output_index=index, content_index=0,
                                 part={"type": "output_text", "text": "", "annotations": [],
                                       "logprobs": []})]
            self.text += event.text
            out.append(self._delta(self.open["id"], index, event.text))
        elif isinstance(event, TokenLogprobs):
            self.held.extend(event.tokens)
        elif isinstance(event, ToolCallStart):
            out += self._close()
            index = len(self.output)
            self.open = _call_item(_item_id("fc"), event.id, event.name, "", "in_progress")
            self.open["call_index"] = event.index
            self.text = ""
            item = {k: v for k, v in self.open.items() if k != "call_index"}
            out.append(self._ev("response.output_item.added", output_index=index, item=item))
        elif isinstance(event, ToolCallArgumentsDelta):
            if self.open is None or self.open.get("call_index") != event.index:
                raise InternalError(f"arguments for call {event.index} arrived while it "
                                            "was not the open call")
            self.text += event.fragment
            out.append(self._ev("response.function_call_arguments.delta", item_id=self.open["id"],
                                output_index=index, delta=event.fragment))
        return out

    def choice_done(self, finished: Finished, choice: int = 0) -> list[SSE]:
        return []

    def finish(self, results: Results) -> list[SSE]:
        status = _status(results.first)
        calls = results.first.tool_calls
        cut_call = bool(calls) and is_cut(calls[-1]) and self.open is not None \
            and self.open.get("call_id") == calls[-1].id
        out = self._close(status if self.open and self.open["type"] in ("message", "reasoning")
                          or cut_call else "completed")
        obj = response_object(self.tr, self.created, status, self.output, results)
        kind = "response.completed" if status == "completed" else "response.incomplete"
        return out + [self._ev(kind, response=obj)]

    def fail(self, error: dict) -> list[SSE]:
        obj = response_object(self.tr, self.created, "failed", self.output,
                              error={"code": error["error"].get("code") or "server_error",
                                     "message": error["error"]["message"]})
        return [self._ev("response.failed", response=obj)]

