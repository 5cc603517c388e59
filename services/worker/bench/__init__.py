"""`infernix bench decode`: what a constraint costs per output token, beside a reference engine.

    cli.py        the command's arguments (light: no torch import)
    decode.py     options, our engine's rounds, the report
    reference.py  Hugging Face generate (+ xgrammar's logits processor) over the same weights
    models.py     the benchmark's models (built-in default, random-weight real shapes), prompts
    stats.py      summaries shared by both engines' rounds
"""

