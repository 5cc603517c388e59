"""The request mix of the load test, as plain data: what `locustfile.py` sends, and what
tests/e2e/test_loadtest_scenarios.py sends once each against a real gateway.

Each scenario is (name, weight, path, JSON body, streams?). The mix: plain chat, JSON Schema
responses, strict tool calls, streaming chat, Anthropic messages with a tool (also streamed), the
Responses API (a JSON Schema text format, streamed), completions with a regex, and the Infernix
`structured_outputs` extension (choice, regex).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

MODEL = "smollm2"
CITIES = ["Paris", "Oslo", "Lima", "Kyoto", "Accra", "Quito", "Perth", "Turin"]
PERSON = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 32},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120},
                         "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 24},
                                     "maxItems": 3}},
          "required": ["name", "age"], "additionalProperties": False}
WEATHER = {"type": "object",
           "properties": {"city": {"type": "string", "maxLength": 24},
                          "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"], "additionalProperties": False}


@dataclass(frozen=True)
class Scenario:
    name: str
    weight: int  # relative frequency in the mix
    path: str
    body: dict[str, Any]
    stream: bool = False


def _user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def scenarios(rng: random.Random, *, max_tokens: int = 64) -> list[Scenario]:
    """One instance of every scenario, with randomised prompts (seeded by `rng`)."""
    city = rng.choice(CITIES)
    tool = {"type": "function", "function": {"name": "get_weather", "strict": True,
                                             "description": "Current weather for a city",
                                             "parameters": WEATHER}}
    return [
        Scenario(
            "chat",
            4,
            "/v1/chat/completions",
            {"model": MODEL, "max_tokens": max_tokens, "messages": _user(f"Tell me about {city}.")},
        ),
        Scenario(
            "chat_stream",
            3,
            "/v1/chat/completions",
            {
                "model": MODEL,
                "max_tokens": max_tokens,
                "stream": True,
                "stream_options": {"include_usage": True},
                "messages": _user(f"Describe a day in {city}."),
            },
            stream=True,
        ),
        Scenario(
            "json_schema",
            3,
            "/v1/chat/completions",
            {
                "model": MODEL,
                "max_tokens": max_tokens,
                "messages": _user("Invent a person as JSON."),
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "person", "schema": PERSON, "strict": True},
                },
            },
        ),
        Scenario(
            "tool_call",
            2,
            "/v1/chat/completions",
            {
                "model": MODEL,
                "max_tokens": max_tokens,
                "tools": [tool],
                "tool_choice": "required",
                "messages": _user(f"What is the weather in {city}?"),
            },
        ),
        Scenario(
            "tool_call_stream",
            1,
            "/v1/chat/completions",
            {
                "model": MODEL,
                "max_tokens": max_tokens,
                "tools": [tool],
                "stream": True,
                "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
                "messages": _user(f"Weather in {city}, please."),
            },
            stream=True,
        ),
        Scenario(
            "anthropic_tool",
            1,
            "/v1/messages",
            {
                "model": MODEL,
                "max_tokens": max_tokens,
                "tools": [{"name": "get_weather", "input_schema": WEATHER, "strict": True}],
                "tool_choice": {"type": "any"},
                "messages": _user(f"Weather in {city}?"),
            },
        ),
        Scenario(
            "choice",
            1,
            "/v1/chat/completions",
            {
                "model": MODEL,
                "max_tokens": 8,
                "messages": _user(f"Is {city} a capital city?"),
                "structured_outputs": {"choice": ["yes", "no"]},
            },
        ),
        # A new grammar almost every time (a literal drawn from 10^6): a cold compile per request.
        Scenario(
            "chat_regex",
            1,
            "/v1/chat/completions",
            {
                "model": MODEL,
                "max_tokens": max_tokens,
                "messages": _user(f"A postcode for {city}."),
                "structured_outputs": {
                    "regex": f"{city[:2].upper()}{rng.randrange(10**6)}-[0-9]{{3}}"
                },
            },
        ),
        Scenario(
            "anthropic_stream",
            1,
            "/v1/messages",
            {
                "model": MODEL,
                "max_tokens": max_tokens,
                "stream": True,
                "messages": _user(f"Name a street in {city}."),
            },
            stream=True,
        ),
        Scenario(
            "responses_json_stream",
            1,
            "/v1/responses",
            {
                "model": MODEL,
                "max_output_tokens": max_tokens,
                "stream": True,
                "input": f"The weather in {city} as JSON.",
                "text": {
                    "format": {
                        "type": "json_schema",
                        "name": "weather",
                        "schema": WEATHER,
                        "strict": True,
                    }
                },
            },
            stream=True,
        ),
        Scenario(
            "responses",
            1,
            "/v1/responses",
            {"model": MODEL, "max_output_tokens": max_tokens, "input": f"Say hi to {city}."},
        ),
        Scenario(
            "completions_regex",
            1,
            "/v1/completions",
            {
                "model": MODEL,
                "max_tokens": max_tokens,
                "prompt": f"The year {city} was founded:",
                "structured_outputs": {"regex": "[0-9]{3,4}"},
            },
        ),
    ]
