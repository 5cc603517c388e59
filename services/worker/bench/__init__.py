"""`infernix bench decode`: what a constraint costs per output token, beside a reference engine.

    decode.py     options, our engine's rounds, the report and the command line
    reference.py  Hugging Face generate (+ xgrammar's logits processor) over the same weights
    models.py     the benchmark's models (built-in default, random-weight real shapes), prompts
    stats.py      summaries shared by both engines' rounds
"""

from services.worker.bench.decode import DecodeBenchOptions, add_parser, bench_decode, write_report
from services.worker.bench.models import random_qwen3_runtime

__all__ = ["DecodeBenchOptions", "add_parser", "bench_decode", "random_qwen3_runtime",
           "write_report"]
