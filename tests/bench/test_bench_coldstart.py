"""`infernix bench coldstart` (bench/coldstart.py): its prompts and its verdict against the
issue's target ("the first request after `/healthz` is ready, and the first request of any new
prompt length (100 to 4,000 tokens): TTFT within 2x of a repeated request of the same length"),
and the `serve --help` settings it measures."""

from __future__ import annotations

import argparse

from bench.coldstart import add_parser, prompt_text, summarize
from services.cli import build_parser


def test_prompts_of_one_length_share_no_prefix_and_scale_with_the_length():
    a, b = prompt_text(500, 1), prompt_text(500, 2)
    assert len(a.split()) == len(b.split()) == 499
    shared = next(i for i, (x, y) in enumerate(zip(a.split(), b.split())) if x != y)
    assert shared < 5  # the prefix cache cannot make the repeat cheaper
    assert prompt_text(500, 1) == a  # reproducible


def test_summary_compares_each_first_request_with_its_repeats_median():
    rows = {100: {"first_ttft_s": 0.3, "repeat_ttft_s": [0.1, 0.2, 0.15]},
            4000: {"first_ttft_s": 0.5, "repeat_ttft_s": [0.4, 0.45]}}
    verdict = summarize(rows, 2.0)
    assert verdict["first_over_repeat"] == {100: 2.0, 4000: round(0.5 / 0.425, 2)}
    assert verdict["met"] is True and verdict["worst"] == 2.0
    rows[100]["first_ttft_s"] = 0.31
    assert summarize(rows, 2.0)["met"] is False
    rows[4000]["first_ttft_s"] = None  # a failed first request never counts as met
    assert summarize({4000: rows[4000]}, 2.0)["met"] is False


def test_serve_help_documents_the_warm_up_and_the_kernel_cache():
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name in ("serve",):
        text = sub.choices[name].format_help()
        assert "--no-warmup" in text and "--kernel-cache" in text
        assert "INFERNIX_NO_WARMUP" in text and "INFERNIX_KERNEL_CACHE" in text
    args = parser.parse_args(["serve", "--no-warmup", "--kernel-cache", "/tmp/k"])
    assert args.no_warmup is True and args.kernel_cache == "/tmp/k"
    bench = argparse.ArgumentParser().add_subparsers()
    add_parser(bench)
    assert "coldstart" in bench.choices
