"""`bench decode`'s Hugging Face reference is timed warm: issue 25, "the reference in `bench
decode` warmed (at least one untimed round per shape), so the HF figure is honest" (its first
full-length round ran three times slower than a warm `generate`)."""

from __future__ import annotations

from types import SimpleNamespace

import bench.reference as reference


def test_every_timed_round_follows_an_untimed_one_of_the_same_shape(monkeypatch):
    calls = []

    def fake_round(model, runtime, prompts, max_tokens, compiled, schemas):
        calls.append((len(prompts), max_tokens, compiled is not None))
        return {"tpot_p50_ms": 1.0}

    monkeypatch.setattr(reference, "_reference_round", fake_round)
    monkeypatch.setattr(reference, "hf_reference_model", lambda runtime: None)
    monkeypatch.setattr(reference, "_xgrammar_compiled", lambda runtime, schemas: ["grammar"])
    monkeypatch.setattr(reference, "_logits_check", lambda model, runtime, n: {})
    monkeypatch.setattr(reference, "prompt_texts", lambda runtime, b, n: ["p"] * b)
    opts = SimpleNamespace(reference_max_tokens=None, max_tokens=12, prompt_tokens=8,
                           reference_batch_sizes=(1, 3), warmup_tokens=4)
    rows = reference.bench_reference(None, opts, log=lambda msg: None, partial=lambda d: None)
    timed = calls[1::2]
    assert len(calls) == 8 and calls[0::2] == timed  # each timed round repeats its warm-up
    assert sorted(timed) == [(1, 12, False), (1, 12, True), (3, 12, False), (3, 12, True)]
    assert rows["warmup"] and rows[1]["tpot_ratio"] == 1.0
