"""One settings table: "every `INFERNIX_*` variable is read in `services/settings.py`" (DESIGN.md,
"Grammar service layout") and "defaults are written once".

A module reads a variable when its code (not a comment or docstring) holds the variable's name as
a string, whole (`"INFERNIX_GEMV"`) or as the start of an f-string (`f"INFERNIX_{name}"`); help
texts that mention a variable inside a sentence are not reads."""

from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path

import pytest

from services import settings
from services.settings import SETTINGS, UsageError, add_settings, default, switch

ROOT = Path(__file__).resolve().parents[2]
_NAME = re.compile(r"INFERNIX_[A-Z0-9_]*")


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            if node.body and isinstance(node.body[0], ast.Expr) and \
                    isinstance(node.body[0].value, ast.Constant):
                out.add(id(node.body[0].value))
    return out


def variable_reads(source: str) -> list[tuple[int, str]]:
    """(line, text) of every string in `source`'s code that names an INFERNIX_* variable."""
    tree = ast.parse(source)
    skip = _docstrings(tree) | {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr)
                                for v in node.values}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            if _NAME.fullmatch(node.value):
                out.append((node.lineno, node.value))
        elif isinstance(node, ast.JoinedStr) and node.values:
            first = node.values[0]
            if isinstance(first, ast.Constant) and str(first.value).startswith("INFERNIX_"):
                out.append((node.lineno, ast.unparse(node)))
    return out


def test_the_scan_finds_reads_and_leaves_prose():
    source = ('"""Set INFERNIX_X."""\nimport os\na = os.environ.get("INFERNIX_GEMV", "1")\n'
              'b = os.environ[f"INFERNIX_{name}"]\nhelp = "a worker (env INFERNIX_WORKERS=a,b)"\n'
              '# INFERNIX_FLA=0 turns it off\n')
    assert variable_reads(source) == [(3, "INFERNIX_GEMV"), (4, "f'INFERNIX_{name}'")]


def test_no_module_but_settings_reads_an_infernix_variable():
    found = []
    for folder in ("services", "shared", "kernels", "bench"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path == ROOT / "services" / "settings.py":
                continue
            found += [f"{path.relative_to(ROOT)}:{line}: {text}"
                      for line, text in variable_reads(path.read_text())]
    assert not found, "INFERNIX_* read outside services/settings.py:\n" + "\n".join(found)


def test_switches_read_the_environment_at_each_call(monkeypatch):
    """Operator switches are read where the code runs (a compile child sees its own environment)
    and parse as the table says; a value outside the choices names the variable."""
    monkeypatch.delenv("INFERNIX_JSON_ENGINE", raising=False)
    assert switch("json_engine") == default("json_engine")
    monkeypatch.setenv("INFERNIX_JSON_ENGINE", "xgrammar")
    assert switch("json_engine") == "xgrammar"
    monkeypatch.setenv("INFERNIX_JSON_ENGINE", "other")
    with pytest.raises(UsageError, match="INFERNIX_JSON_ENGINE='other'"):
        switch("json_engine")
    monkeypatch.setenv("INFERNIX_FLA", "0")
    assert switch("fla") is False
    monkeypatch.setenv("INFERNIX_MAX_GRAMMAR_BYTES", "123")
    from services.grammar.schema import max_grammar_bytes

    assert max_grammar_bytes() == 123


def test_a_switch_has_no_flag():
    with pytest.raises(ValueError, match="gemv"):
        add_settings(argparse.ArgumentParser(), "gemv")


def test_configuration_defaults_are_the_tables():
    """"Defaults are written once": the classes a flag configures take the table's default."""
    from services.embedded import WorkerSettings
    from services.grammar.cache.cache_types import CacheConfig
    from services.grammar.cache.limits import CompileLimits, StorePolicy

    worker = WorkerSettings()
    for name in ("model", "device", "lanes", "max_len", "prefill_chunk", "num_draft_tokens"):
        assert getattr(worker, name) == default(name), name
    cache = CacheConfig()
    assert (cache.cache_bytes, cache.max_cold_compiles, cache.slot_wait_s, cache.isolation,
            cache.reject_ttl_s) == tuple(default(n) for n in (
                "grammar_cache_bytes", "max_cold_compiles", "cold_slot_wait_s",
                "compile_isolation", "compile_reject_ttl_s"))
    assert CompileLimits() == CompileLimits(default("compile_deadline_s"),
                                            default("compile_memory_bytes"))
    assert StorePolicy() == StorePolicy(default("grammar_load_ms_per_mb"),
                                        default("grammar_store_min_speedup"),
                                        default("grammar_load_ms_fixed"))
    assert set(SETTINGS) == {s.name for s in settings._TABLE}  # one row per name
