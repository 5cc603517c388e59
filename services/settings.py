"""Every setting of Infernix's commands, in one table: flag, environment variable, type, default,
help. A flag `--max-len` is also the environment variable `INFERNIX_MAX_LEN`; the command line
wins over the environment, the environment over the default. Nothing here imports more than the
standard library, so `infernix ... --help` answers at once.
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
            "equal prompt prefixes are then never reused; hybrid models run without it anyway)"),
    Setting("no_pipeline", None, False, "launch each decode step only after the previous one's "
            "commit (on CUDA the next step's forward is launched first by default, so the commit's "
            "host work overlaps it; the CPU never pipelines)"),
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
            "dflash or dflash2 (a draft model, --draft-model, on a dense target); omitted: off",
            "BACKEND"),
    Setting("draft_model", str, None, "checkpoint directory of the draft model (dflash, dflash2)",
            "DIR"),
    Setting("num_draft_tokens", _positive, 4, "drafts per request and round with --speculative",
            "K"),
)
SETTINGS: dict[str, Setting] = {s.name: s for s in _TABLE}


def env_value(setting: Setting, default: Any) -> Any:
    """The environment's value of `setting`, parsed, or `default`. Raises UsageError naming the
    variable when it does not parse."""
    raw = os.environ.get(setting.env)
    if raw is None:
        return default
    try:
        return (setting.type or _bool)(raw)
    except ValueError as exc:
        raise UsageError(f"{setting.env}={raw!r}: {exc}") from None


def add_settings(parser: argparse.ArgumentParser, *names: str, **defaults: Any) -> None:
    """Add the named settings to `parser`; `defaults` overrides the table's default for this
    command (e.g. a service's own port). Help texts show the default and the variable."""
    for name in names:
        s = SETTINGS[name]
        default = defaults.get(name, s.default)
        value = env_value(s, default)
        shown = "off" if default is False else ("none" if default in (None, "") else default)
        text = f"{s.help} (default: {shown}; env {s.env})"
        if s.type is None:
            parser.add_argument(s.flag, action="store_true", default=value, help=text)
        else:
            parser.add_argument(s.flag, type=s.type, default=value, metavar=s.metavar, help=text)
