"""Load test for a running Infernix gateway: `locust -f loadtest/locustfile.py --host
http://127.0.0.1:8000` (pip install locust). The mix is `scenarios.py`: plain and streaming chat,
JSON Schema responses, strict tool calls (also streamed), Anthropic messages and choices.

Set INFERNIX_API_KEY when the gateway requires a key, LOADTEST_MAX_TOKENS to change the output
length (default 64).
"""

from __future__ import annotations

import os
import random
import sys

from locust import HttpUser, between, task

sys.path.insert(0, os.path.dirname(__file__))
from scenarios import scenarios  # noqa: E402

MAX_TOKENS = int(os.environ.get("LOADTEST_MAX_TOKENS", "64"))
KEY = os.environ.get("INFERNIX_API_KEY", "")


class InfernixUser(HttpUser):
    wait_time = between(0.1, 1.0)

    def on_start(self) -> None:
        self.rng = random.Random()
        if KEY:
            self.client.headers.update({"Authorization": f"Bearer {KEY}", "x-api-key": KEY})

    @task
    def one_request(self) -> None:
        mix = scenarios(self.rng, max_tokens=MAX_TOKENS)
        scenario = self.rng.choices(mix, weights=[s.weight for s in mix])[0]
        with self.client.post(scenario.path, json=scenario.body, stream=scenario.stream,
                              name=scenario.name, catch_response=True) as reply:
            if reply.status_code != 200:
                reply.failure(f"HTTP {reply.status_code}: {reply.text[:200]}")
                return
            if scenario.stream:
                body = b"".join(reply.iter_content(chunk_size=None))
                if b'"error"' in body or b"event: error" in body:
                    reply.failure("the stream ended with an error event")
                    return
            reply.success()
