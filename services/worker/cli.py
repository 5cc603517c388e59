"""`infernix generate`: one generation from the command line through the in-process worker.

    infernix generate --prompt "Name three colours" --json-schema-file colours.json --json
    infernix generate --prompt "Once upon a time" --raw --max-tokens 40 --stream

    infernix generate --model DIR --thinking-budget 64 --prompt "Is 91 prime?"

--prompt is one user message rendered with the model's chat template (ChatML for the built-in
model); --raw continues the text as is. Content constraints are mutually exclusive. A model with a
thinking mode (Qwen3.5) thinks by its template's default; --no-thinking turns it off, and
--thinking-budget N forces the close of the reasoning after N tokens. Output: the content on
stdout (streamed as it comes with --stream) and the reasoning, if any, on stderr; with --json one
JSON object with the whole result (content, reasoning, finish_reason, usage, constraint report,
error, timings), preceded by one {"delta": ...} or {"reasoning_delta": ...} line per delta when
--stream is given too. Exit status: 0 when the output ended normally or
at the length limit, 1 on a generation error or cancellation, 2 when the request was rejected.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import uuid
from typing import Any, TextIO

from services.constraint_flags import add_constraint_args, constraints_from_args
from services.settings import SETTINGS, UsageError, add_settings, env_value
from shared.contract import OutputConstraint
from shared.errors import InfernixError, InternalError, InvalidRequest
from shared.frontends.chatml import messages_from_dicts
from shared.generation import (
    ChatMessage,
    Finished,
    FinishReason,
    GenerateRequest,
    PromptInput,
    ReasoningDelta,
    RequestOptions,
    SamplingParams,
    TextDelta,
)

EXIT_OK, EXIT_FAILED, EXIT_REJECTED = 0, 1, 2


def add_generate_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the `generate` subcommand to `sub` (its func is `run_generate`)."""
    p = sub.add_parser("generate", help="generate one output with the in-process worker",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_settings(p, "model", "device", "max_len", "speculative", "draft_model", "num_draft_tokens",
                 "draft_vocab")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", metavar="TEXT",
                        help="one user message, rendered with the model's ChatML chat template "
                             "(with --raw: raw text to continue)")
    source.add_argument("--messages", metavar="FILE",
                        help='JSON file: a list of {"role": ..., "content": ...} chat messages')
    p.add_argument("--raw", action="store_true",
                   help="continue --prompt as raw text, without the chat template")
    add_constraint_args(p, many_files=False)
    p.add_argument("--max-tokens", type=int, default=256, metavar="N",
                   help="output token limit (default: 256)")
    p.add_argument("--temperature", type=float, default=1.0, metavar="T",
                   help="sampling temperature, 0 = greedy (default: 1.0)")
    p.add_argument("--seed", type=int, default=None, metavar="S",
                   help="RNG seed (default: drawn at random)")
    thinking = p.add_mutually_exclusive_group()
    thinking.add_argument("--thinking", dest="enable_thinking", action="store_const", const=True,
                          default=None, help="turn the model's thinking mode on")
    thinking.add_argument("--no-thinking", dest="enable_thinking", action="store_const",
                          const=False, help="turn the model's thinking mode off")
    p.add_argument("--thinking-budget", type=int, default=None, metavar="N",
                   help="reasoning tokens before the close is forced (default: no budget)")
    p.add_argument("--stream", action="store_true", help="print text as it is generated")
    p.add_argument("--json", action="store_true",
                   help="print the whole result as JSON, constraint report included")
    p.set_defaults(func=run_generate)
    return p


def _has_constraint(args: argparse.Namespace) -> bool:
    return bool(args.json_schema_file or args.grammar_file or args.regex is not None
                or args.choice or args.json_object)


def request_from_args(args: argparse.Namespace) -> GenerateRequest:
    """The GenerateRequest the arguments describe. Raises InfernixError for invalid inputs,
    UsageError for unreadable files."""
    if args.raw and args.prompt is None:
        raise InvalidRequest("--raw continues --prompt text; it does not apply to --messages",
                             field="raw")
    if args.messages is not None:
        try:
            with open(args.messages, encoding="utf-8") as f:
                items = json.load(f)
        except OSError as exc:
            raise UsageError(f"cannot read {args.messages}: {exc.strerror or exc}") from None
        except ValueError as exc:
            raise InvalidRequest(f"{args.messages} is not JSON: {exc}", field="messages") from None
        if not isinstance(items, list):
            raise InvalidRequest("the messages file must hold a JSON list", field="messages")
        prompt = PromptInput(messages=messages_from_dicts(items),
                             enable_thinking=args.enable_thinking)
    elif args.raw:
        prompt = PromptInput(text=args.prompt)
    else:
        prompt = PromptInput(messages=(ChatMessage("user", args.prompt),),
                             enable_thinking=args.enable_thinking)
    constraint: OutputConstraint | None = None
    if _has_constraint(args):
        constraint = constraints_from_args(args)[0][1]
    options = RequestOptions(max_tokens=args.max_tokens, constraint=constraint,
                             sampling=SamplingParams(temperature=args.temperature, seed=args.seed),
                             thinking_budget=args.thinking_budget)
    return GenerateRequest(f"cli-{uuid.uuid4().hex[:12]}", prompt, options, model=args.model)


def validate_constraint(request: GenerateRequest) -> None:
    """Check the request's constraint against the model's vocabulary without loading the model:
    an invalid schema or grammar is reported in moments, not after the model load. Raises the
    grammar service's typed errors."""
    constraint = request.options.constraint
    if constraint is None:
        return
    from services.grammar.client import check_constraint
    from shared.frontends import get_domain

    check_constraint(constraint, get_domain(request.model))


def result_json(fin: Finished) -> dict[str, Any]:
    return {"content": fin.content, "reasoning": fin.reasoning,
            "finish_reason": fin.finish_reason.value,
            "usage": {"prompt_tokens": fin.usage.prompt_tokens,
                      "completion_tokens": fin.usage.completion_tokens,
                      "reasoning_tokens": fin.usage.reasoning_tokens},
            "constraint": fin.constraint, "error": fin.error, "timings": fin.timings}


async def generate_once(client, request: GenerateRequest, *, stream: bool, as_json: bool,
                        out: TextIO, err: TextIO | None = None) -> Finished:
    """Run `request` through a WorkerClient, printing as the flags say (plain reasoning goes to
    `err`, default stderr); returns Finished."""
    err = err or sys.stderr
    async for event in client.generate(request):
        if isinstance(event, TextDelta) and stream:
            out.write(json.dumps({"delta": event.text}, ensure_ascii=False) + "\n" if as_json
                      else event.text)
            out.flush()
        elif isinstance(event, ReasoningDelta) and stream:
            if as_json:
                out.write(json.dumps({"reasoning_delta": event.text}, ensure_ascii=False) + "\n")
                out.flush()
            else:
                err.write(event.text)
                err.flush()
        elif isinstance(event, Finished):
            if as_json:
                out.write(json.dumps(result_json(event), ensure_ascii=False) + "\n")
            else:
                if event.reasoning:
                    err.write(("" if stream else event.reasoning) + "\n")
                out.write(("" if stream else event.content) + "\n")
            out.flush()
            return event
    raise InternalError("the worker ended the stream without a Finished event")


def run_generate(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None,
                 *, runtime=None) -> int:
    """`infernix generate`; `runtime` overrides the model (tests). Returns the exit status."""
    out, err = out or sys.stdout, err or sys.stderr
    from services.worker.client import open_in_process
    from services.worker.engine import EngineConfig
    from services.worker.runtime import load_runtime

    try:
        from services.worker.spec import check_backend

        speculative = getattr(args, "speculative", None)
        draft_model = getattr(args, "draft_model", None)
        # Unsupported before the model loads
        check_backend(speculative, draft_model, getattr(args, "draft_vocab", None))
        request = request_from_args(args)
        if runtime is None:  # the real command line (tests pass a runtime and keep their logging)
            validate_constraint(request)
            from shared.logging import configure_logging

            configure_logging(env_value(SETTINGS["log_level"], "WARNING"))
            runtime = load_runtime(request.model, device=args.device)
        else:
            request = GenerateRequest(request.request_id, request.prompt, request.options,
                                      model=runtime.name)
    except InfernixError as exc:
        err.write(json.dumps({"error": exc.to_dict()}) + "\n")
        return EXIT_REJECTED if exc.fault == "request" else EXIT_FAILED

    async def main() -> int:
        client = open_in_process(runtime, EngineConfig(
            max_batch=1, max_len=args.max_len, speculative=speculative, draft_model=draft_model,
            num_draft_tokens=getattr(args, "num_draft_tokens", 4),
            draft_vocab=getattr(args, "draft_vocab", None)))
        try:
            fin = await generate_once(client, request, stream=args.stream, as_json=args.json,
                                      out=out, err=err)
        except InfernixError as exc:
            err.write(json.dumps({"error": exc.to_dict()}) + "\n")
            return EXIT_REJECTED if exc.fault == "request" else EXIT_FAILED
        finally:
            await client.aclose()
        if fin.finish_reason in (FinishReason.STOP, FinishReason.LENGTH, FinishReason.TOOL_CALLS):
            return EXIT_OK
        if fin.error is not None and not args.json:
            err.write(json.dumps({"error": fin.error}) + "\n")
        return EXIT_FAILED

    return asyncio.run(main())
