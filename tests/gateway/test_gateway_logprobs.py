"""Log-probabilities through the official `openai` SDK on the real embedded default (SmolLM2 on
the CPU): chat, legacy completions and Responses, streamed and not, n = 2, under a constraint,
with n-gram speculation and over the worker's gRPC service.

The expected values are computed here, independently of the worker's logprobs path: the model's
forward over the prompt and the reported output (one prefill of a fresh KV cache), the legal set
of a choice constraint built from the vocabulary's bytes, and the sampler's own reference
distribution (`kernels/sampling_ref.py`'s sort-based `reference_distribution`) or, for greedy,
the masked log-softmax at temperature 1 (docs/using-openai-chat.md, "Log-probabilities")."""

from __future__ import annotations

import json
import math

import pytest
import pytest_asyncio
import torch

from kernels.sampling_contract import PenaltyHistory
from kernels.sampling_contract import SamplingParams as KernelParams
from kernels.sampling_ref import penalized_logits, reference_distribution
from services.worker.client import open_in_process
from services.worker.engine import EngineConfig
from services.worker.remote import GrpcWorkerClient
from services.worker.runtime import load_runtime
from services.worker.service import create_server
from shared.contract import OutputConstraint
from shared.generation import (
    ChatMessage,
    GenerateRequest,
    PromptInput,
    RequestOptions,
    SamplingParams,
    TokenLogprobs,
)
from tests.conftest import free_port
from tests.support.fake_worker import running_gateway

pytestmark = pytest.mark.asyncio(loop_scope="module")
CHOICES = ("alpha", "beta", "gamma")
MESSAGES = [{"role": "user", "content": "Name a Greek letter."}]


@pytest.fixture(scope="module")
def runtime():
    return load_runtime()


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def gateway_url(runtime):
    """The conftest's embedded gateway, over a runtime this module also reads for references."""
    worker = open_in_process(runtime, EngineConfig(max_batch=2, max_len=512))
    try:
        async with running_gateway(worker) as url:
            yield url
    finally:
        await worker.aclose()


def _forward(runtime, ids: list[int]) -> torch.Tensor:
    """logits [len(ids), V] of one prefill over `ids` (position i: the next-token logits)."""
    model = runtime.model
    state = model.new_state(1, len(ids) + 1, dtype=torch.float32, device="cpu")
    tokens = torch.tensor([ids])
    with torch.no_grad():
        return model(tokens, torch.arange(len(ids))[None], state, torch.tensor([0]))[0].float()


@pytest.fixture(scope="module")
def by_bytes(runtime) -> dict[bytes, list[int]]:
    out: dict[bytes, list[int]] = {}
    for i, b in enumerate(runtime.domain.token_bytes):
        out.setdefault(b, []).append(i)
    return out


def _id(by_bytes, entry, logp: torch.Tensor) -> int:
    # The reported token's id: of the ids with the reported bytes, the likeliest one at its
    # position (SmolLM2's byte strings are unique among ordinary ids).
    return max(by_bytes[bytes(entry.bytes)], key=lambda i: float(logp[i]))


def _prompt_ids(runtime, messages, text: str | None = None) -> list[int]:
    prompt = PromptInput(text=text) if text is not None else \
        PromptInput(messages=tuple(ChatMessage(m["role"], m["content"]) for m in messages))
    return list(runtime.prepare(prompt).token_ids)


def _reference(runtime, by_bytes, messages, entries, *, temperature, top_p=1.0, legal=None,
               presence=0.0, frequency=0.0):
    """Per reported token: (the reference log p [V] at its position, its id)."""
    prompt = _prompt_ids(runtime, messages)
    domain = runtime.domain
    ids: list[int] = []
    out = []
    for k, entry in enumerate(entries):
        z = _forward(runtime, prompt + ids)[-1, :domain.size]
        never = set(range(len(domain.token_bytes), domain.size)) | set(domain.never_ids)
        z[list(never)] = float("-inf")
        if legal is not None:
            z = torch.where(legal(ids), z, float("-inf"))
        seen = sorted(set(ids))  # the output so far: presence and frequency penalties
        history = PenaltyHistory(torch.tensor([seen or [-1]], dtype=torch.int32),
                                 torch.tensor([[ids.count(t) for t in seen] or [0]],
                                              dtype=torch.int32))
        params = KernelParams.from_rows(1, temperature=temperature or 1.0, top_p=top_p,
                                        presence_penalty=presence, frequency_penalty=frequency)
        if temperature == 0:
            z = penalized_logits(z[None], domain.size, params, history)[0]
            logp = torch.log_softmax(z.double(), 0)
        else:
            probs, _ = reference_distribution(z[None], params, vocab_size=domain.size,
                                              penalties=history)
            logp = torch.log(probs[0].double())
        token = _id(by_bytes, entry, logp)
        ids.append(token)
        out.append((logp, token))
    return out


def _choice_mask(runtime):
    """The legal set of `structured_outputs.choice` CHOICES after the output `ids`, from the
    vocabulary's bytes: an ordinary token that keeps the text a prefix of a choice, or EOS once
    the text is a whole choice."""
    domain = runtime.domain
    table = domain.token_bytes
    words = [c.encode() for c in CHOICES]
    ordinary = [i for i, b in enumerate(table) if b and domain.is_ordinary(i)
                and any(w.find(b) >= 0 for w in words)]  # only pieces of a choice can continue one

    def legal(ids: list[int]) -> torch.Tensor:
        text = b"".join(table[i] for i in ids)
        ok = torch.zeros(domain.size, dtype=torch.bool)
        for i in ordinary:
            if any(w.startswith(text + table[i]) for w in words):
                ok[i] = True
        if text in words:
            ok[list(domain.eos_ids)] = True
        return ok

    return legal


def _close(got: float, want: float) -> bool:
    return math.isclose(got, want, abs_tol=2e-3)


async def test_chat_logprobs_equal_the_reference_distribution(chat, runtime, by_bytes):
    """Default (processed) mode: each token's logprob is log p of the distribution it was sampled
    from (penalties, temperature and top-p applied, renormalised), the alternatives are that
    distribution's most likely tokens in order, and tokens outside its support are never
    listed."""
    reply = await chat.chat.completions.create(
        model="smollm2", messages=MESSAGES, max_tokens=8, temperature=0.9, top_p=0.95, seed=7,
        presence_penalty=1.5, frequency_penalty=0.5, logprobs=True, top_logprobs=5)
    choice = reply.choices[0]
    entries = choice.logprobs.content
    assert choice.logprobs.refusal is None and len(entries) == reply.usage.completion_tokens
    assert "".join(e.token for e in entries) == choice.message.content
    reference = _reference(runtime, by_bytes, MESSAGES, entries, temperature=0.9, top_p=0.95,
                           presence=1.5, frequency=0.5)
    for entry, (logp, token) in zip(entries, reference):
        assert _close(entry.logprob, float(logp[token]))
        support = int(torch.isfinite(logp).sum())
        assert len(entry.top_logprobs) == min(5, support)
        want = torch.topk(logp, len(entry.top_logprobs)).values.tolist()
        assert all(_close(a.logprob, w) for a, w in zip(entry.top_logprobs, want))
        assert bytes(entry.bytes) == runtime.domain.token_bytes[token]


async def test_chat_greedy_logprobs_under_a_constraint(chat, runtime, by_bytes):
    """Greedy rows report the masked log-softmax at temperature 1: the chosen token is the top
    alternative, every listed token is legal under the constraint (illegal ids are -inf and
    never listed), and the values equal the masked reference."""
    legal = _choice_mask(runtime)
    reply = await chat.chat.completions.create(
        model="smollm2", messages=MESSAGES, max_tokens=8, temperature=0, logprobs=True,
        top_logprobs=20, extra_body={"structured_outputs": {"choice": list(CHOICES)}})
    entries = reply.choices[0].logprobs.content
    assert reply.choices[0].message.content in CHOICES
    reference = _reference(runtime, by_bytes, MESSAGES, entries, temperature=0, legal=legal)
    ids: list[int] = []
    for entry, (logp, token) in zip(entries, reference):
        assert entry.top_logprobs[0].token == entry.token and _close(entry.logprob,
                                                                     float(logp[token]))
        allowed = legal(ids)
        for alt in entry.top_logprobs:  # each listed token is legal at this position
            assert any(allowed[i] for i in by_bytes[bytes(alt.bytes)])
        assert len(entry.top_logprobs) == min(20, int(allowed.sum()))
        ids.append(token)


async def test_chat_json_schema_alternatives_are_legal(chat, runtime, by_bytes):
    """Under a JSON Schema (an enum of strings) every listed alternative keeps the text a JSON
    prefix of one of the values (whitespace around the value allowed, as JSON allows it), or is
    the end token once a whole value is written: the mask removed everything else."""
    schema = {"type": "string", "enum": list(CHOICES)}
    reply = await chat.chat.completions.create(
        model="smollm2", messages=MESSAGES, max_tokens=12, temperature=0.8, seed=3,
        logprobs=True, top_logprobs=20,
        response_format={"type": "json_schema", "json_schema": {"name": "g", "schema": schema}})
    entries = reply.choices[0].logprobs.content
    values = [json.dumps(c).encode() for c in CHOICES]
    eos = {runtime.domain.token_bytes[i] for i in runtime.domain.eos_ids}
    text = b""
    assert json.loads(reply.choices[0].message.content) in CHOICES
    for entry in entries:
        for alt in entry.top_logprobs:
            grown = (text + bytes(alt.bytes)).lstrip(b" \t\n\r")
            assert any(v.startswith(grown) for v in values) or grown.rstrip() in values or \
                (bytes(alt.bytes) in eos and text.strip() in values), (text, alt.token)
        text += bytes(entry.bytes)


async def test_chat_stream_aggregate_equals_the_reply_with_two_choices(chat):
    """n = 2, streamed: the chunks' logprobs.content of each choice concatenate to the
    non-streamed reply's (greedy, so both runs choose the same tokens; a batch row's float
    rounding may differ in the last digits), and a stop string does not lose entries."""
    kwargs = dict(model="smollm2", messages=MESSAGES, max_tokens=6, temperature=0, n=2,
                  logprobs=True, top_logprobs=2, stop=[" is"])
    reply = await chat.chat.completions.create(**kwargs)
    streamed: dict[int, list] = {0: [], 1: []}
    stream = await chat.chat.completions.create(stream=True, **kwargs)
    async for chunk in stream:
        for c in chunk.choices:
            if c.logprobs is not None and c.logprobs.content:
                streamed[c.index] += c.logprobs.content
    for c in reply.choices + [reply.choices[0]]:
        assert c.logprobs.content and _same(c.logprobs.content, streamed[c.index])
    assert _same(reply.choices[0].logprobs.content, reply.choices[1].logprobs.content)


def _same(a, b) -> bool:
    def flat(entries):
        return [(e.token, e.bytes, [(t.token, t.bytes) for t in e.top_logprobs]) for e in entries]

    values = [(e.logprob, [t.logprob for t in e.top_logprobs]) for e in a], \
        [(e.logprob, [t.logprob for t in e.top_logprobs]) for e in b]
    return flat(a) == flat(b) and all(
        math.isclose(x, y, abs_tol=1e-4) and all(math.isclose(p, q, abs_tol=1e-4)
                                                 for p, q in zip(xs, ys))
        for (x, xs), (y, ys) in zip(*values))


async def test_completions_and_responses_shapes(chat):
    """Legacy completions: tokens, token_logprobs, top_logprobs (the alternatives and the chosen
    token) and text_offset; Responses: output_text parts and streamed deltas carry the entries,
    and the streamed deltas concatenate to the reply's part."""
    reply = await chat.completions.create(model="smollm2", prompt="The sky is", max_tokens=5,
                                          temperature=0, logprobs=3)
    lp = reply.choices[0].logprobs
    assert "".join(lp.tokens) == reply.choices[0].text
    assert lp.text_offset == [sum(map(len, lp.tokens[:i])) for i in range(len(lp.tokens))]
    for token, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert top[token] == value and len(top) == 3 and max(top.values()) == value
    kwargs = dict(model="smollm2", input="Name a Greek letter.", max_output_tokens=6,
                  temperature=0, top_logprobs=2, include=["message.output_text.logprobs"])
    response = await chat.responses.create(**kwargs)
    part = response.output[0].content[0]
    assert "".join(e.token for e in part.logprobs) == part.text and response.top_logprobs == 2
    deltas = []
    async with chat.responses.stream(**kwargs) as stream:
        async for event in stream:
            if event.type == "response.output_text.delta":
                deltas += [e.model_dump() for e in event.logprobs]
    assert deltas == [e.model_dump() for e in part.logprobs]


async def _entries(worker, request) -> list:
    out = []
    async for event in worker.generate(request):
        if isinstance(event, TokenLogprobs):
            out += event.tokens
    return out


def _request(request_id: str, text: str, constraint=None) -> GenerateRequest:
    options = RequestOptions(max_tokens=16, sampling=SamplingParams(temperature=0), logprobs=3,
                             constraint=constraint)
    return GenerateRequest(request_id, PromptInput(text=text), options)


async def test_speculative_rows_report_plain_decoding_logprobs(runtime):
    """n-gram speculation at temperature 0 (with grammar drafts on the constrained row): each
    accepted draft's logprob comes from the verify forward at its own position, with that
    position's mask and penalty history, so the entries equal plain decoding's (design: "At
    temperature 0 speculative output is token-identical to plain decoding")."""
    text = "red green blue, " * 6 + "red"  # a continuation the n-gram drafter copies
    choice = OutputConstraint.choice(["a dark red line of text", "a light green line of text"])
    plain = open_in_process(runtime, EngineConfig(max_batch=2, max_len=256))
    spec = open_in_process(runtime, EngineConfig(max_batch=2, max_len=256, speculative="ngram"))
    try:
        want = await _entries(plain, _request("plain", text))
        want += await _entries(plain, _request("plain-c", "Pick:", choice))
        got = await _entries(spec, _request("spec", text))
        copied = spec.engine.speculation.accepted
        got += await _entries(spec, _request("spec-c", "Pick:", choice))
        assert copied > 0 and spec.engine.speculation.accepted > copied  # both verified drafts
    finally:
        await plain.aclose()
        await spec.aclose()
    assert [(e.token_id, [a.token_id for a in e.top]) for e in got] == \
        [(e.token_id, [a.token_id for a in e.top]) for e in want]
    assert all(math.isclose(a.logprob, b.logprob, abs_tol=1e-4) for a, b in zip(got, want))


async def test_logprobs_cross_the_worker_grpc_service(runtime):
    """Over the compose deployment's route (gateway -> gRPC -> worker) the request's logprobs
    and every TokenLogprobs event arrive as the in-process worker sends them."""
    worker = open_in_process(runtime, EngineConfig(max_batch=1, max_len=256))
    server = create_server(worker)
    port = free_port()
    await server.start("127.0.0.1", port)
    client = GrpcWorkerClient("127.0.0.1", port)
    try:
        want = await _entries(worker, _request("local", "Say hello."))
        got = await _entries(client, _request("remote", "Say hello."))
    finally:
        await client.aclose()
        server.close()
        await server.wait_closed()
        await worker.aclose()
    assert got and [(e.token_id, e.token, [a.token_id for a in e.top]) for e in got] == \
        [(e.token_id, e.token, [a.token_id for a in e.top]) for e in want]


async def test_raw_mode_reports_the_model_distribution(runtime, by_bytes):
    """`--logprobs-mode raw` (EngineConfig.logprobs_mode): the model's own log-softmax at
    temperature 1, before the constraint's mask: under a choice constraint the values equal the
    unmasked reference, and the alternatives include tokens the constraint forbids."""
    worker = open_in_process(runtime, EngineConfig(max_batch=1, max_len=256,
                                                   logprobs_mode="raw"))
    choice = OutputConstraint.choice(list(CHOICES))
    try:
        entries = await _entries(worker, _request("raw", "Pick:", choice))
    finally:
        await worker.aclose()
    domain = runtime.domain
    prompt = _prompt_ids(runtime, None, text="Pick:")
    ids = [e.token_id for e in entries]
    logits = _forward(runtime, prompt + ids)[len(prompt) - 1:, :domain.size]
    never = list(set(range(len(domain.token_bytes), domain.size)) | set(domain.never_ids))
    logits[:, never] = float("-inf")
    reference = torch.log_softmax(logits.double(), 1)
    legal = _choice_mask(runtime)
    illegal_listed = False
    for k, entry in enumerate(entries):
        assert _close(entry.logprob, float(reference[k, entry.token_id]))
        want = torch.topk(reference[k], 3).values.tolist()
        assert all(_close(a.logprob, w) for a, w in zip(entry.top, want))
        allowed = legal(ids[:k])
        illegal_listed |= any(not allowed[a.token_id] for a in entry.top)
    assert "".join(e.token.decode() for e in entries) in CHOICES and illegal_listed
