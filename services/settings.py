"""Every setting of Infernix, in one table: flag, environment variable, type, default, help. A
flag `--max-len` is also the environment variable `INFERNIX_MAX_LEN`; the command line wins over
the environment, the environment over the default. A few operator switches have no flag (`flag`
False: `INFERNIX_GEMV`, ...); code reads them through `switch(name)`. This module is the only one
that reads an `INFERNIX_*` variable, and each default is written here once (configuration classes
take theirs from `default(name)`). Nothing here imports more than the standard library, so
`infernix ... --help` answers at once.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


class UsageError(Exception):
    """A user mistake on the command line or in a file it names: one line on stderr, exit 2."""


@dataclass(frozen=True)
class Setting:
    name: str  # "max_len": flag --max-len, environment INFERNIX_MAX_LEN
    type: Callable[[str], Any] | None  # None: a boolean switch (present = true)
    default: Any
    help: str
    metavar: str | None = None
    choices: tuple[str, ...] | None = None  # the values a string setting may take
    has_flag: bool = True  # False: an operator switch, only its environment variable
    many: bool = False  # a list: the flag takes one or more values, the variable a comma list

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return "INFERNIX_" + self.name.upper()


def _bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"expected true or false, got {text!r}")


def _log_level(text: str) -> str:
    level = text.strip().upper()
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
        raise ValueError(f"expected DEBUG, INFO, WARNING or ERROR, got {text!r}")
    return level


def _address(text: str) -> str:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    return text


def _speculative(text: str) -> str:
    value = text.strip().lower()
    if value not in ("grammar", "ngram", "mtp", "dflash", "dflash2"):
        raise ValueError(f"expected grammar, ngram, mtp, dflash or dflash2, got {text!r}")
    return value


def _on_unless_zero(text: str) -> bool:
    return text != "0"


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(f"expected an integer >= 1, got {text!r}")
    return value


_TABLE = (
    Setting("model", str, "smollm2", "the model: the built-in name smollm2 or a Hugging Face "
            "checkpoint directory", "NAME|DIR"),
    Setting("device", str, "cpu", "torch device: cpu or cuda"),
    Setting("lanes", int, 4, "resident lanes: the largest decode batch", "N"),
    Setting("max_len", int, 2048, "positions per lane, prompt plus output", "N"),
    Setting("prefill_chunk", int, 512, "prompt tokens per prefill step, shared by the rows reading "
            "their prompts (bounds how long a long prompt delays decoding rows)", "N"),
    Setting("preempt_after", float, None, "pause a running request (resumed later by Replay) when "
            "another has waited this many seconds for a lane; omitted: never", "SECONDS"),
    Setting("kv_cache_tokens", int, None, "KV pool size in positions (blocks of 16); omitted: "
            "lanes x max_len; more leaves the prefix cache room beyond the lanes", "N"),
    Setting("no_prefix_cache", None, False, "turn the automatic prefix cache off (KV blocks of "
            "equal prompt prefixes are then never reused, nor a hybrid model's state snapshots)"),
    Setting("served_model_name", str, None, "the model names clients call it by (one or more; "
            "the first is listed first); omitted: the --model value as given", "NAME",
            many=True),
    Setting("no_pipeline", None, False, "launch each decode step only after the previous one's "
            "commit (on CUDA the next step's forward is launched first by default, so the commit's "
            "host work overlaps it; the CPU never pipelines)"),
    Setting("no_warmup", None, False, "serve without the start-up warm-up (on CUDA every "
            "prefill width, batch size, decode and verify graph and sampler variant runs once "
            "before health says ready, so no kernel compiles on the request path; the CPU never "
            "warms up)"),
    Setting("kernel_cache", str, "~/.cache/infernix/kernels", "directory of the compiled-kernel "
            "cache on CUDA (Triton's binaries and autotuning results, fla-core's included): a "
            "restart on the same machine reuses it; TRITON_CACHE_DIR, when set, wins", "DIR"),
    Setting("host", str, "127.0.0.1", "address to listen on"),
    Setting("port", int, 8000, "port to listen on"),
    Setting("api_keys", str, "", "comma-separated API keys; when set, requests must carry one",
            "K1,K2"),
    Setting("ignore_unknown_fields", None, False, "accept and ignore request fields no protocol "
            "documents (never a field that changes the output)"),
    Setting("redis_url", str, None, "Redis for the shared compiled-grammar store; omitted: "
            "in-process cache only", "URL"),
    Setting("grammar_cache_bytes", int, 256 << 20, "byte budget of the compiled-grammar cache "
            "(in process and in Redis)", "BYTES"),
    Setting("grammar", _address, None, "the grammar service; omitted: compile in process",
            "HOST:PORT"),
    Setting("max_waiting", int, None, "requests that may wait for a lane; beyond it a request is "
            "refused with 429 and Retry-After; omitted: 4 x lanes", "N"),
    Setting("drain_seconds", float, 30.0, "on the first SIGTERM, how long requests in flight may "
            "run before the rest are cancelled", "SECONDS"),
    Setting("metrics_port", int, 0, "serve Prometheus /metrics on this port (0: off)", "PORT"),
    Setting("log_level", _log_level, "INFO", "log level: DEBUG, INFO, WARNING or ERROR"),
    Setting("speculative", _speculative, None, "speculative decoding backend: grammar (the text "
            "a constraint forces), ngram (n-gram copy from the request's own context), mtp (a "
            "Qwen3.5 model's MTP module; ngram and mtp add grammar drafts on constrained rows), "
            "dflash or dflash2 (a draft model, --draft-model, on a dense Llama/Qwen3 or a Qwen3.5 "
            "target; its context cache is paid from the KV budget); omitted: off",
            "BACKEND"),
    Setting("draft_model", str, None, "checkpoint directory of the draft model (dflash, dflash2)",
            "DIR"),
    Setting("num_draft_tokens", _positive, 4, "drafts per request and round with --speculative",
            "K"),
    Setting("draft_vocab", _positive, None, "with --speculative mtp: draft among the first N "
            "token ids only (a BPE vocabulary's most frequent tokens), so each draft step's LM "
            "head reads N rows instead of the whole vocabulary; the output is unchanged, fewer "
            "drafts may be accepted; omitted: the whole vocabulary", "N"),
    Setting("logprobs_mode", str, "processed", "what logprobs report: processed (the "
            "distribution each token was sampled from: penalties, the grammar mask and the "
            "sampling transforms applied; greedy rows: the masked log-softmax at temperature 1) "
            "or raw (the model's own log-softmax)", choices=("processed", "raw")),
    # The gateway's workers (`--worker` repeated; the variable is a comma-separated list).
    Setting("workers", str, "", "comma-separated worker addresses", "HOST:PORT,...",
            has_flag=False),
    # The grammar service's models (`--models a b`; the variable is a comma-separated list).
    Setting("models", str, "smollm2", "models to serve", "A,B", has_flag=False),
    # The compile limits, cold slots and store policy of the compiled-grammar caches.
    Setting("compile_deadline_s", float, 30.0, "a cold compile running longer is stopped: "
            "ConstraintTooComplex", "SECONDS"),
    Setting("compile_memory_bytes", int, 2 << 30, "a cold compile growing its process by more "
            "is stopped", "BYTES"),
    Setting("max_cold_compiles", int, 2, "cold compiles at once per model", "N"),
    Setting("cold_slot_wait_s", float, 10.0, "a request waits this long for a cold slot, then "
            "gets Overloaded", "SECONDS"),
    Setting("compile_isolation", str, "thread", "where cold compiles of unknown cost run (only "
            "'process' enforces the memory budget and stops a runaway compile)",
            choices=("process", "thread")),
    Setting("grammar_store_min_speedup", float, 4.0, "store and ship a compiled grammar only "
            "when it loads this many times faster than it compiles; 0 stores all", "X"),
    Setting("grammar_load_ms_per_mb", float, 50.0, "predicted load time per MB of compiled "
            "footprint (measured by `infernix bench grammar-store`)", "MS"),
    Setting("compile_reject_ttl_s", float, 600.0, "a constraint stopped by a compile limit is "
            "refused at once for this long, without taking a cold slot (0: never remembered)",
            "SECONDS"),
    Setting("grammar_load_ms_fixed", float, 1.0, "predicted fixed cost of one load, in ms", "MS"),
    # A worker's client of the grammar service.
    Setting("grammar_timeout_s", float, 120.0, "deadline of one Compile call to the grammar "
            "service", "SECONDS"),
    Setting("grammar_retry_s", float, 2.0, "while the grammar service is unreachable, try it "
            "again this often", "SECONDS"),
    Setting("grammar_fallback", str, "on", "on: serve without the grammar service while it is "
            "unreachable (Redis, in-process builds); off: answer GrammarServiceUnavailable",
            choices=("on", "off")),
    # Operator switches without a flag (read where the code runs, also in compile children).
    Setting("gemv", _on_unless_zero, True, "0: the fused path's decode-row weight GEMMs take "
            "F.linear (cuBLAS) instead of kernels/gemv.py's Triton GEMV", has_flag=False),
    Setting("width_invariant", _on_unless_zero, False, "1: every CUDA forward of up to 32 "
            "tokens a row computes each row as a decode step would (one GEMV config per weight "
            "shape, attention per query with context splits fixed by the lane length), so "
            "speculative greedy decoding is token-identical to plain greedy in bf16 / fp16",
            has_flag=False),
    Setting("cpu_gemv", _on_unless_zero, True, "0: CPU decode rows take F.linear on the float32 "
            "weights instead of kernels/cpu_gemv.py on the GGUF's Q4_1 / Q8_0 blocks",
            has_flag=False),
    Setting("fla", _on_unless_zero, True, "0: Qwen3.5 prefill takes the torch chunked gated delta "
            "rule even when fla-core is installed", has_flag=False),
    Setting("mtp_graphs", _on_unless_zero, True, "0: the MTP proposer's draft pass (its "
            "alignment and k steps) runs eagerly instead of replaying CUDA graphs",
            has_flag=False),
    Setting("prefill_graphs", _on_unless_zero, True, "0: short prefill forwards (a prefix-cache "
            "hit's, a short prompt's) run eagerly instead of replaying CUDA graphs captured at "
            "warm-up", has_flag=False),
    Setting("json_engine", str, "llguidance", "the engine of JSON content; xgrammar, the engine "
            "of record, runs everything else", choices=("llguidance", "xgrammar"),
            has_flag=False),
    # Beyond it xgrammar's compile takes minutes (a 47 MB grammar of 75,000 rules from nested
    # oneOf complements was measured), and a compile in a thread cannot be stopped.
    Setting("max_grammar_bytes", int, 2_000_000, "the size limit of a grammar emitted from a "
            "JSON Schema, checked before xgrammar sees it", "BYTES", has_flag=False),
)
SETTINGS: dict[str, Setting] = {s.name: s for s in _TABLE}


def env_value(setting: Setting, default: Any) -> Any:
    """The environment's value of `setting`, parsed, or `default`. Raises UsageError naming the
    variable when it does not parse."""
    raw = os.environ.get(setting.env)
    if raw is None:
        return default
    if setting.many:
        values = [v.strip() for v in raw.split(",") if v.strip()]
        if not values:
            raise UsageError(f"{setting.env}={raw!r}: expected one or more comma-separated values")
        return [(setting.type or str)(v) for v in values]
    try:
        value = (setting.type or _bool)(raw)
    except ValueError as exc:
        raise UsageError(f"{setting.env}={raw!r}: {exc}") from None
    if setting.choices is not None and value not in setting.choices:
        raise UsageError(f"{setting.env}={raw!r}: expected one of {', '.join(setting.choices)}")
    return value


def default(name: str) -> Any:
    """The table's default of setting `name` (a configuration class's field default)."""
    return SETTINGS[name].default


def switch(name: str) -> Any:
    """The current value of setting `name` from the environment, or its default; read at each
    call, so a child process started with another environment sees its own. Raises UsageError
    naming the variable when it does not parse."""
    return env_value(SETTINGS[name], SETTINGS[name].default)


def add_settings(parser: argparse.ArgumentParser, *names: str, **defaults: Any) -> None:
    """Add the named settings to `parser`; `defaults` overrides the table's default for this
    command (e.g. a service's own port). Help texts show the default and the variable."""
    for name in names:
        s = SETTINGS[name]
        default = defaults.get(name, s.default)
        value = env_value(s, default)
        shown = "off" if default is False else ("none" if default in (None, "") else default)
        text = f"{s.help} (default: {shown}; env {s.env})"
        if not s.has_flag:
            raise ValueError(f"setting {name} has no flag")
        if s.type is None:
            parser.add_argument(s.flag, action="store_true", default=value, help=text)
        elif s.choices is not None:
            parser.add_argument(s.flag, choices=s.choices, default=value, help=text)
        elif s.many:
            parser.add_argument(s.flag, type=s.type, nargs="+", default=value, metavar=s.metavar,
                                help=text)
        else:
            parser.add_argument(s.flag, type=s.type, default=value, metavar=s.metavar, help=text)
