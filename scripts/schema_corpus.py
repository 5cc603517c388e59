"""Build, check and summarise the held-out JSON Schema corpus (docs/schema-corpus.md).

    # 1. build the corpus from a JSONSchemaBench snapshot (a git directory, e.g. the one the
    #    search tool's fetch of guidance-ai/jsonschemabench gives), labelled by `jsonschema`:
    python scripts/schema_corpus.py build --jsb-git DIR --out corpus/schemas.jsonl
    # 2. compile every schema and test every instance with the product's own checker:
    infernix grammar check --batch corpus/schemas.jsonl > corpus/result.jsonl
    # 3. the figures (compile rate, invalid accepted, valid accepted, typed rejections):
    python scripts/schema_corpus.py summarize corpus/schemas.jsonl corpus/result.jsonl
    # only some schemas (those a change can affect), as a corpus of their own:
    python scripts/schema_corpus.py subset corpus/schemas.jsonl --ids IDS --out corpus/part.jsonl

Each corpus line is a `grammar check --batch` line: {"json_schema": ..., "values": [...]} plus
"id", "source", "split" ("dev" or "held": a hash of the id decides), and "valid" (one boolean per
value: what `jsonschema` says, with format checking, for the schema's declared dialect).
Values are the source's own test instances (valid and invalid) and mutations of the valid ones that
`jsonschema` rejects; the product checks each value in the generation layout (declared property
order), see services/grammar/schema/layout.py. Labelling never imports the product's schema code
(only `reduce` does, to tell which schemas a change can affect).

    # after a change: reduce with the old and the new code, check only what differs
    python scripts/schema_corpus.py reduce corpus/schemas.jsonl --out corpus/reduce-new.jsonl
    python scripts/schema_corpus.py changed corpus/reduce-old.jsonl corpus/reduce-new.jsonl > ids
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import random
import subprocess
import sys
from collections import Counter
from typing import Any, Iterator

# Categories of JSONSchemaBench's maskbench/data and how many schemas to take from each.
CATEGORIES = {
    "Github_trivial": 60, "Github_easy": 200, "Github_medium": 200, "Github_hard": 150,
    "Github_ultra": 40, "Glaiveai2K": 120, "Kubernetes": 120, "JsonSchemaStore": 100,
    "Snowplow": 80, "WashingtonPost": 40, "BFCL": 60, "JME": 30, "MCPspec": 20, "Handwritten": 30,
}
MAX_SCHEMA_BYTES = 150_000  # larger schemas are skipped (keeps the corpus a few MB)
MUTATIONS_PER_VALUE = 3


def _git_files(git_dir: str, prefix: str) -> Iterator[tuple[str, bytes]]:
    """(path, content) of every blob under `prefix` at HEAD; blobs absent from the snapshot (large
    files) are skipped."""
    names = subprocess.run(
        [
            "git",
            f"--git-dir={git_dir}",
            "ls-tree",
            "-r",
            "--format=%(objectname) %(path)",
            "HEAD",
            prefix,
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split("\n")
    pairs = [ln.split(" ", 1) for ln in names if ln]
    proc = subprocess.Popen(
        ["git", f"--git-dir={git_dir}", "cat-file", "--batch"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert proc.stdin and proc.stdout
    for sha, path in pairs:
        proc.stdin.write(sha.encode() + b"\n")
        proc.stdin.flush()
        header = proc.stdout.readline().split()
        if len(header) < 3:  # "<sha> missing"
            continue
        data = proc.stdout.read(int(header[2]))
        proc.stdout.read(1)
        yield path, data
    proc.stdin.close()
    proc.wait()


def _category(name: str) -> str:
    base = name.rsplit("/", 1)[-1]
    return base.split("---")[0] if "---" in base else base.split("_")[0]


def _validator(schema: Any):
    import jsonschema

    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


_REPLACEMENTS = [None, True, 0, -1, 1.5, "", "x", [], {}, 10**12, "2020-13-45", "not an email"]


def _leaf_paths(value: Any, path: tuple = ()) -> list[tuple]:
    out = [path]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _leaf_paths(v, path + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _leaf_paths(v, path + (i,))
    return out


def _set(value: Any, path: tuple, new: Any) -> Any:
    if not path:
        return new
    out = copy.deepcopy(value)
    node = out
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = new
    return out


def mutate(value: Any, rng: random.Random) -> Any:
    """One random mutation: a replaced node, a dropped or added member, an edited string."""
    path = rng.choice(_leaf_paths(value))
    node = value
    for p in path:
        node = node[p]
    kind = rng.randrange(4)
    if kind == 0 and isinstance(node, dict) and node:
        new = dict(node)
        del new[rng.choice(list(new))]
        return _set(value, path, new)
    if kind == 1 and isinstance(node, dict):
        return _set(value, path, {**node, "zz_extra": rng.choice(_REPLACEMENTS)})
    if kind == 2 and isinstance(node, str) and node:
        i = rng.randrange(len(node))
        return _set(value, path, node[:i] + rng.choice("0Z:-a/ .@T9") + node[i + 1:])
    if kind == 3 and isinstance(node, list):
        return _set(value, path, node + ([copy.deepcopy(node[-1])] if node else [0]))
    return _set(value, path, rng.choice(_REPLACEMENTS))


def build(args: argparse.Namespace) -> int:
    by_cat: dict[str, list[tuple[str, bytes]]] = {}
    for path, data in _git_files(args.jsb_git, "maskbench/data"):
        by_cat.setdefault(_category(path), []).append((path, data))
    lines = []
    for cat, quota in CATEGORIES.items():
        files = sorted(by_cat.get(cat, []), key=lambda p: hashlib.sha256(p[0].encode()).hexdigest())
        taken = 0
        for path, data in files:
            if taken >= quota:
                break
            if len(data) > MAX_SCHEMA_BYTES:
                continue
            doc = json.loads(data)
            line = _label(path, cat, doc)
            if line is not None:
                lines.append(line)
                taken += 1
    with open(args.out, "w", encoding="utf-8") as f:
        for line in lines:
            f.write(json.dumps(line, ensure_ascii=False) + "\n")
    counts = Counter(ln["source"] for ln in lines)
    print(json.dumps({"schemas": len(lines), "by_source": counts,
                      "values": sum(len(ln["values"]) for ln in lines),
                      "valid": sum(sum(ln["valid"]) for ln in lines)}, indent=1))
    return 0


def _label(path: str, cat: str, doc: dict) -> dict | None:
    schema = doc["schema"]
    ident = path.rsplit("/", 1)[-1]
    try:
        v = _validator(schema)
        values, valid = [], []
        for test in doc.get("tests", []):
            values.append(test["data"])
            valid.append(bool(v.is_valid(test["data"])))
        rng = random.Random(ident)
        for value in [x for x, ok in zip(list(values), list(valid)) if ok]:
            for _ in range(MUTATIONS_PER_VALUE):
                m = mutate(value, rng)
                if not v.is_valid(m):
                    values.append(m)
                    valid.append(False)
    except Exception as exc:  # the oracle cannot judge this schema: keep it, without instances
        print(f"{ident}: jsonschema cannot validate: {type(exc).__name__}", file=sys.stderr)
        values, valid = [], []
    split = "held" if hashlib.sha256(ident.encode()).digest()[0] % 2 else "dev"
    return {"id": ident, "source": cat, "split": split, "json_schema": schema, "values": values,
            "valid": valid}


def summarize(args: argparse.Namespace) -> int:
    with open(args.corpus, encoding="utf-8") as f:
        corpus = [json.loads(ln) for ln in f if ln.strip()]
    with open(args.result, encoding="utf-8") as f:
        results = [json.loads(ln) for ln in f if ln.strip()]
    if len(corpus) != len(results):
        raise SystemExit(f"{len(corpus)} corpus lines but {len(results)} result lines")
    out: dict[str, Any] = {}
    for split in ("dev", "held", "all"):
        rows = [(c, r) for c, r in zip(corpus, results) if split == "all" or c["split"] == split]
        compiled = [(c, r) for c, r in rows if r.get("ok")]
        valid_total = valid_ok = invalid_total = invalid_accepted = 0
        bad = []
        for c, r in compiled:
            layout = r.get("values_accepted", [])
            raw = r.get("values_accepted_raw", [False] * len(layout))
            for value, ok, acc, acc_raw in zip(c["values"], c["valid"], layout, raw):
                if ok:
                    valid_total += 1
                    valid_ok += bool(acc)
                else:
                    invalid_total += 1
                    if acc or acc_raw:  # wrongly accepted in either text
                        invalid_accepted += 1
                        bad.append(c["id"])
        rejected = [r for _, r in rows if not r.get("ok")]
        typed = [
            r
            for r in rejected
            if r["error"].get("type") in ("UnsupportedSchema", "InvalidSchema")
            and "pointer" in r["error"]
        ]
        reasons = Counter(_reason(r["error"]) for r in rejected)
        annotations = Counter(a for _, r in compiled for a in r.get("annotations", []))
        out[split] = {
            "schemas": len(rows), "compiled": len(compiled),
            "compile_rate": round(len(compiled) / max(1, len(rows)), 4),
            "valid_values": valid_total, "valid_accepted": valid_ok,
            "valid_accept_rate": round(valid_ok / max(1, valid_total), 4),
            "invalid_values": invalid_total, "invalid_accepted": invalid_accepted,
            "invalid_accepted_ids": sorted(set(bad)),
            "rejections": len(rejected), "rejections_typed_with_pointer": len(typed),
            "top_rejection_reasons": reasons.most_common(40),
            "top_annotations": annotations.most_common(25),
        }
    json.dump(out, sys.stdout, indent=1)
    print()
    return 0


def subset(args: argparse.Namespace) -> int:
    """The corpus lines whose ids are listed (one per line, or comma-separated) in `--ids`, in
    corpus order: for re-running only the schemas a change can affect."""
    with open(args.ids, encoding="utf-8") as f:
        wanted = {i.strip() for i in f.read().replace(",", "\n").split("\n") if i.strip()}
    with open(args.corpus, encoding="utf-8") as f, open(args.out, "w", encoding="utf-8") as out:
        for line in f:
            if line.strip() and json.loads(line)["id"] in wanted:
                out.write(line)
    return 0


def reduce(args: argparse.Namespace) -> int:
    """Reduce and emit every schema with the product's code (no vocabulary, no xgrammar compile):
    one line per schema with the typed error or the SHA-256 of its grammar text. Minutes where
    the full check takes most of an hour; two such files (`changed`) tell which schemas a code
    change can affect. This is the only command that imports the product."""
    import signal

    from services.grammar.schema import schema_to_ebnf
    from shared.errors import InfernixError

    def alarm(*_: Any) -> None:
        raise TimeoutError

    signal.signal(signal.SIGALRM, alarm)
    with open(args.corpus, encoding="utf-8") as f, open(args.out, "w", encoding="utf-8") as out:
        for line in f:
            if not line.strip():
                continue
            c = json.loads(line)
            row: dict[str, Any] = {"id": c["id"]}
            signal.alarm(args.timeout)
            try:
                # as content compiles (compiler.py): the JSON companions run beside the matcher
                text = schema_to_ebnf(c["json_schema"], unique_names=True, unique_items=True)
                row.update(ok=True, grammar_sha=hashlib.sha256(text.encode()).hexdigest())
            except InfernixError as exc:
                row.update(ok=False, type=type(exc).__name__, pointer=getattr(exc, "pointer", None),
                           message=exc.message)
            except TimeoutError:
                row.update(ok=None, message=f"no result within {args.timeout} s")
            finally:
                signal.alarm(0)
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
            out.flush()
    return 0


def changed(args: argparse.Namespace) -> int:
    """Ids (one per line) whose `reduce` result differs between OLD and NEW, or that NEW rejects:
    the schemas to check again after a change (the others keep their grammar byte for byte)."""
    def rows(path: str) -> dict[str, dict]:
        with open(path, encoding="utf-8") as f:
            return {r["id"]: r for r in map(json.loads, filter(str.strip, f))}

    old, new = rows(args.old), rows(args.new)
    for i, r in new.items():
        o = old.get(i, {})
        if not r.get("ok") or not o.get("ok") or o.get("grammar_sha") != r.get("grammar_sha"):
            print(i)
    return 0


def _reason(error: dict) -> str:
    """A short bucket for a rejection: the keyword at the end of its pointer plus the message's
    first words."""
    pointer = error.get("pointer", "")
    key = pointer.rsplit("/", 1)[-1] if pointer else "(root)"
    if key.isdigit():
        key = pointer.rsplit("/", 2)[-2] + "/N"
    msg = error.get("message", "").split(": ", 1)[-1]
    return f"{error.get('type')} {key}: {' '.join(msg.split()[:6])}"


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument(
        "--jsb-git", required=True, help="git directory of a guidance-ai/jsonschemabench snapshot"
    )
    b.add_argument("--out", required=True)
    b.set_defaults(func=build)
    s = sub.add_parser("summarize")
    s.add_argument("corpus")
    s.add_argument("result")
    s.set_defaults(func=summarize)
    r = sub.add_parser("reduce")
    r.add_argument("corpus")
    r.add_argument("--out", required=True)
    r.add_argument("--timeout", type=int, default=120, help="seconds per schema")
    r.set_defaults(func=reduce)
    c = sub.add_parser("changed")
    c.add_argument("old")
    c.add_argument("new")
    c.set_defaults(func=changed)
    u = sub.add_parser("subset")
    u.add_argument("corpus")
    u.add_argument("--ids", required=True, help="a file of corpus ids (lines or commas)")
    u.add_argument("--out", required=True)
    u.set_defaults(func=subset)
    args = p.parse_args()
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
