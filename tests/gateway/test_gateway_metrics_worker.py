"""The worker's constraint and speculation counters on the gateway's /metrics (one registry for
the gateway, the engine and the grammar cache, as `infernix serve` has): mask positions, mask
upload bytes, drafts proposed / accepted / rolled back, and preparation timed by stage (the
prompt's input apart from its constraint). A real engine over random 2-layer weights and the
SmolLM2 vocabulary; the metrics are compared with the constraint reports of the same requests."""

from __future__ import annotations

import http.client
import re

import openai
import pytest
from prometheus_client import CollectorRegistry

from tests.support.fake_worker import InProcessGateway

REGISTRY = CollectorRegistry()


def _open():
    from services.worker.client import open_in_process
    from services.worker.engine import EngineConfig
    from tests.support.tiny_worker import tiny_smollm2_runtime

    return open_in_process(tiny_smollm2_runtime(), EngineConfig(
        max_batch=2, max_len=256, speculative="ngram", num_draft_tokens=3), registry=REGISTRY)


@pytest.fixture(scope="module")
def gateway():
    with InProcessGateway(_open, registry=REGISTRY) as gw:
        yield gw


def scrape(gateway) -> dict[str, float]:
    host, port = gateway.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    return {m["name"]: float(m["value"]) for m in re.finditer(
        r"^(?P<name>infernix_worker_\w+(?:\{[^}]*\})?) (?P<value>\S+)$", text, re.MULTILINE)}


def test_mask_draft_and_preparation_counters_match_the_reports(gateway):
    """Seed: Prometheus counts mask positions, mask upload bytes and accepted / rolled-back
    drafts, and input preparation is timed apart from constraint preparation; labels are fixed
    enums (stage: input | constraint; result: proposed | accepted | rolled_back)."""
    prompt = "a b c a b c a b c a b c a b c"
    reports = []
    with openai.OpenAI(base_url=gateway.url + "/v1", api_key="k", max_retries=0) as client:
        for regex in ("(a b c ){3}", "[0-9]{4}"):
            reply = client.completions.create(
                model="smollm2", prompt=prompt, max_tokens=12, temperature=0,
                extra_body={"structured_outputs": {"regex": regex}})
            reports.append(reply.choices[0].model_extra["infernix"]["constraint"])
        client.completions.create(model="smollm2", prompt=prompt, max_tokens=12, temperature=0)
    m = scrape(gateway)
    assert m["infernix_worker_mask_positions_total"] == sum(r["mask_positions"] for r in reports)
    assert m["infernix_worker_mask_positions_total"] > 0
    assert m["infernix_worker_mask_upload_bytes_total"] == \
        sum(r["mask_upload_bytes"] for r in reports)
    proposed = m['infernix_worker_spec_draft_tokens_total{result="proposed"}']
    accepted = m['infernix_worker_spec_draft_tokens_total{result="accepted"}']
    rolled_back = m['infernix_worker_spec_draft_tokens_total{result="rolled_back"}']
    assert proposed > 0 and proposed == accepted + rolled_back
    for stage in ("input", "constraint"):
        assert m[f'infernix_worker_prepare_seconds_count{{stage="{stage}"}}'] == 3
        assert m[f'infernix_worker_prepare_seconds_sum{{stage="{stage}"}}'] > 0
