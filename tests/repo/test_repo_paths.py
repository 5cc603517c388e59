"""Every repository path named in a comment or a document exists (DESIGN.md, "Grammar service
layout": "every repository path named in a comment or doc exists").

Where paths are looked for: README.md and docs/*.md (their whole text), and the comments and
docstrings (module, class and function) of every Python file under services/, shared/, kernels/
and bench/. Code strings are not read: they are data, and a wrong one fails where it is used.

Which tokens count as paths (a token is a maximal run of letters, digits and `_ . * - /`; URLs
are removed first, and a `<placeholder>` reads as `*`):

- rooted: the token's first component is a top-level folder of the repository followed by `/`
  (`services/grammar/cache/`, `bench/*.py`, `tests/test_<component>.py`): it must exist
  at that place (a folder with or without its final `/`), `*` matching within one component;
- relative: the token has a `/` and ends in a file name with a source extension (.py .pyi .md
  .proto .jinja .sh .toml), e.g. `program/verify.py` in the README's worker row or
  `notes/models.md`: some repository file's path must end with it at a component boundary;
- bare: a file name ending in .py or .md with no `/` (`rewrite.py`): some repository file must
  have that name. Bare names with other extensions are not ours often enough (a checkpoint's
  `chat_template.jinja`) to count.

A path of another repository (a document cites its folders) is listed in FOREIGN with the reason.
"""

from __future__ import annotations

import ast
import fnmatch
import io
import re
import subprocess
import tokenize
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CODE_ROOTS = ("services", "shared", "kernels", "bench")
SOURCE_EXT = ("py", "pyi", "md", "proto", "jinja", "sh", "toml")

# (document, token): paths inside other repositories that a document names beside its link.
FOREIGN = {
    # JSON-Schema-Test-Suite's own folder of format instances, cited as a corpus source.
    ("docs/schema-corpus.md", "tests/*/optional/format/"),
}

_URL = re.compile(r"\b[a-z][a-z0-9+.-]*://\S+")
_TOKEN = re.compile(r"[A-Za-z0-9_.*/-]+")
_PLACEHOLDER = re.compile(r"<[A-Za-z0-9_ -]+>")


@lru_cache(maxsize=1)
def repository_files() -> tuple[str, ...]:
    """Tracked files and untracked ones git does not ignore (a new file counts before commit)."""
    def git(*args: str) -> list[str]:
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True)
        return out.stdout.split("\n")
    names = git("ls-files") + git("ls-files", "--others", "--exclude-standard")
    return tuple(sorted({n for n in names if n and (ROOT / n).exists()}))


def _with_folders(files: tuple[str, ...]) -> set[str]:
    out = set(files)
    for f in files:
        parts = f.split("/")
        out.update("/".join(parts[:i]) + "/" for i in range(1, len(parts)))
    return out


def path_tokens(text: str, top_level: set[str]) -> list[str]:
    """The tokens of `text` that count as repository paths (the module docstring's rules)."""
    found = []
    for raw in _TOKEN.findall(_PLACEHOLDER.sub("*", _URL.sub(" ", text))):
        token = raw.rstrip(".-")  # a sentence's full stop is not part of the path
        if token.startswith("./"):
            token = token[2:]
        head = token.split("/", 1)[0]
        if "/" in token and head in top_level:
            found.append(token)
        elif "/" in token:
            name = token.rsplit("/", 1)[1]
            if name.rsplit(".", 1)[-1] in SOURCE_EXT and "." in name:
                found.append(token)
        elif re.fullmatch(r"[A-Za-z0-9_*-]+\.(py|md)", token):
            found.append(token)
    return found


def resolves(token: str, top_level: set[str], known: set[str]) -> bool:
    """Whether `token` names something in `known` (files, and folders ending in `/`)."""
    if token.split("/", 1)[0] in top_level and "/" in token:
        folder = token if token.endswith("/") else token + "/"
        return any(fnmatch.fnmatchcase(k, pattern) and k.count("/") == pattern.count("/")
                   for pattern in (token, folder) for k in known)
    if "/" not in token:
        return any(fnmatch.fnmatchcase(k.rsplit("/", 1)[-1], token) for k in known)
    depth = token.count("/")
    return any(fnmatch.fnmatchcase("/".join(k.split("/")[-depth - 1:]), token) for k in known
               if k.count("/") >= depth)


def comment_texts(source: str) -> list[tuple[int, str]]:
    """(line, text) of every comment and docstring of a Python source."""
    out = [(t.start[0], t.string) for t in tokenize.generate_tokens(io.StringIO(source).readline)
           if t.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc is not None:
                out.append((node.body[0].lineno, doc))
    return out


@lru_cache(maxsize=1)
def named_paths(files: tuple[str, ...]) -> list[tuple[str, int, str]]:
    """(file, line, token) for every path named in the documents and the code's comments."""
    top_level = {f.split("/", 1)[0] for f in files if "/" in f}
    out = []
    for f in files:
        if f == "README.md" or (f.startswith("docs/") and f.endswith(".md")):
            texts = list(enumerate((ROOT / f).read_text().splitlines(), 1))
        elif f.split("/", 1)[0] in CODE_ROOTS and f.endswith(".py"):
            texts = comment_texts((ROOT / f).read_text())
        else:
            continue
        for line, text in texts:
            out.extend((f, line, token) for token in path_tokens(text, top_level))
    return out


def test_token_rules_pick_paths_and_leave_prose():
    top = {"services", "docs", "tests"}
    text = ("see services/grammar/cache/ and docs/benchmarks.md. The `program/verify.py` row, "
            "notes/models.md, rewrite.py, tests/test_<name>.py, and/or K/V, NaN/inf, "
            "https://x.org/a/b.py, a config.json and bench-out/decode.json")
    tokens = path_tokens(text, top)
    assert tokens == ["services/grammar/cache/", "docs/benchmarks.md", "program/verify.py",
                      "notes/models.md", "rewrite.py", "tests/test_*.py"]
    known = {"services/", "services/grammar/", "services/grammar/cache/", "docs/", "tests/",
             "docs/benchmarks.md", "services/worker/program/verify.py",
             "services/gbnf/rewrite.py", "tests/test_x.py"}
    assert [t for t in tokens if not resolves(t, top, known)] == ["notes/models.md"]
    assert not resolves("services/verify.py", top, known)  # rooted: at that place only
    assert resolves("services/*/program/verify.py", top, known)
    assert resolves("services/grammar", top, known)  # a folder without its final slash


def test_every_named_repository_path_exists():
    files = repository_files()
    known = _with_folders(files)
    top_level = {f.split("/", 1)[0] for f in files if "/" in f}
    missing = [f"{f}:{line}: {token}" for f, line, token in named_paths(files)
               if (f, token) not in FOREIGN and not resolves(token, top_level, known)]
    assert not missing, "paths named but absent:\n" + "\n".join(missing)


def test_foreign_paths_are_still_named():
    """An entry of FOREIGN that no document names any more is stale."""
    named = {(f, token) for f, _, token in named_paths(repository_files())}
    assert FOREIGN <= named, FOREIGN - named
