"""bench.qwen35_framings walks one canonical output per framing through the real Qwen3.5 grammar;
a grammar change that makes a walk illegal stops the bench, so the walk is checked here (the
bench's `required` case went stale once: a forced call to a non-strict tool follows its declared
properties, so the loose call was refused)."""

import json

from bench import qwen35_framings


def test_every_framing_walk_is_legal_and_complete(tmp_path):
    out = tmp_path / "framings.json"
    assert qwen35_framings.main(["--out", str(out)]) == 0
    cases = json.loads(out.read_text())["cases"]
    assert [c["case"] for c in cases] == ["json (baseline)", "thinking + json",
                                          "thinking + xml strict (auto)", "xml non-strict (auto)",
                                          "thinking + json | xml"]
    for case in cases:
        walked = sum(r["tokens"] for r in case["by_region"].values())
        assert case["mask_fill_us"]["tokens"] == walked
    assert cases[3]["names_apply_us"]["tokens"] == cases[3]["mask_fill_us"]["tokens"]
