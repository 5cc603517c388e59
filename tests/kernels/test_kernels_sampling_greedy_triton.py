"""The fused greedy kernel (kernels/sampling_greedy_triton.py, Triton) against `sample_greedy`
(kernels/sampling_greedy.py, torch) on logits with the never-generable ids at -inf, which is what
the sampler computed before (its `_generable` index_fill copy, then the masked argmax).

Contract (kernels/sampling_contract.py): "T = 0 takes the largest z in A, ties to the smaller id";
"Statuses per row: OK; DEAD_END when A is empty; NONFINITE when a legal value is NaN or +inf, or
every legal value is -inf (no finite candidate). Illegal values are never inspected. A failed row
carries token 0 only as an in-range placeholder and probability 0."

Backends: `interpreter` (Triton's interpreter on the CPU, small shapes, in a child pytest:
TRITON_INTERPRET must be set before triton is first imported, see
tests/kernels/test_kernels_sampling.py) and `cuda` (native, marked gpu). The generable-mask helper,
the dispatcher's torch fallback and the sampler's CPU path run in this process.
"""

from __future__ import annotations

import os

import pytest
import torch

from kernels.sampling_contract import SampleStatus, mask_words
from kernels.sampling_greedy import generable_words, sample_greedy, sample_greedy_fast
from tests.support.kernel_backends import run_interpreted

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
OK, DEAD_END, NONFINITE = SampleStatus.OK, SampleStatus.DEAD_END, SampleStatus.NONFINITE
GPU = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
BACKENDS = ["interpreter"] if INTERPRETED else [pytest.param("cuda", marks=GPU)]


def pack(legal: torch.Tensor) -> torch.Tensor:
    """bool [R, V] -> int32 [R, ceil(V/32)]: bit i of word w = token 32w + i, zero bits beyond V."""
    rows, vocab = legal.shape
    bits = torch.zeros(rows, mask_words(vocab) * 32, dtype=torch.int64)
    bits[:, :vocab] = legal.cpu().to(torch.int64)
    words = (bits.view(rows, -1, 32) << torch.arange(32)).sum(dim=2)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def reference(z, vocab, mask=None, mask_row=None, never=()):
    """What the sampler computed before: never-generable ids at -inf in a copy, then the argmax."""
    z = z[:, :vocab].float().clone()
    if len(never):
        z[:, list(never)] = float("-inf")
    return sample_greedy(z, vocab_size=vocab, mask=mask, mask_row=mask_row)


def fused(z, vocab, mask=None, mask_row=None, never=(), **kw):
    from kernels.sampling_greedy_triton import sample_greedy_triton
    gen = generable_words(vocab, list(never), z.device) if len(never) else None
    return sample_greedy_triton(z, vocab_size=vocab, mask=mask, mask_row=mask_row, generable=gen,
                                **kw)


def assert_same(got, want):
    for name in ("tokens", "status", "prob", "uniform"):
        g, w = getattr(got, name).cpu(), getattr(want, name).cpu()
        assert g.dtype == w.dtype, (name, g.dtype, w.dtype)
        assert g.tolist() == w.tolist(), (name, g.tolist(), w.tolist())


V = 1000  # neither a multiple of 32 nor of any block below
NEVER = (3, 500, 998)  # never generable, each holding some row's largest value below


def scenario(dtype, device):
    """Logits [14, V + 40] (garbage past V), a speculative-layout mask [7, 2, W] and per row what
    the contract says. Returns (logits, mask, mask_row, expected statuses, expected tokens)."""
    gen = torch.Generator().manual_seed(5)
    n = 14
    z = torch.randn(n, V + 40, generator=gen)
    z[:, V:] = 1e4
    z[::2, V + 3] = float("nan")  # garbage columns are never read
    legal = torch.rand(n, V, generator=gen) < 0.3
    constrained = [True] * n
    want_tok = {}
    constrained[0] = False  # r0: unconstrained, the largest value at a never-generable id
    z[0, 500] = 50.0
    z[0, 777] = 40.0
    want_tok[0] = 777
    legal[2] = False  # r2: empty legal set -> DEAD_END (its values are all finite)
    z[3, 17] = float("nan")
    legal[3, 17] = True  # r3: a legal NaN -> NONFINITE
    z[4, 900] = float("inf")
    legal[4, 900] = True  # r4: a legal +inf -> NONFINITE
    z[5] = float("-inf")  # r5: every legal value -inf -> NONFINITE
    z[6, 20], z[6, 21], z[6, 600] = float("nan"), float("inf"), 1e30  # r6: illegal, never read
    legal[6, [20, 21, 600]] = False
    legal[6, 601] = True
    z[6, 601] = 30.0
    want_tok[6] = 601
    z[7, [130, 260, 261]] = 20.0  # r7: a tie across chunks and within one: the smaller id
    legal[7, [130, 260, 261]] = True
    want_tok[7] = 130
    z[8, 999] = 25.0  # r8: the maximum in the last partial chunk (and last partial word)
    legal[8, 999] = True
    want_tok[8] = 999
    constrained[9] = False  # r9: unconstrained, a NaN -> NONFINITE
    z[9, 444] = float("nan")
    legal[10] = False  # r10: only never-generable ids legal -> -inf values: NONFINITE, not DEAD_END
    legal[10, [3, 998]] = True
    z[11, 3] = float("nan")  # r11: a NaN at a never-generable legal id: not inspected
    z[11, 998] = float("inf")
    legal[11, [3, 998, 64]] = True
    z[11, 64] = 10.0
    want_tok[11] = 64
    z[12] = -1.0  # r12: -0.0 (id 40) ties +0.0 (id 41): the smaller id
    z[12, 40], z[12, 41] = -0.0, 0.0
    legal[12, [40, 41, 42]] = True
    want_tok[12] = 40
    constrained[13] = False  # r13: unconstrained, all -inf but one generable id
    z[13] = float("-inf")
    z[13, 998] = 5.0  # never generable
    z[13, 5] = -3.0
    want_tok[13] = 5
    want_status = {2: DEAD_END, 3: NONFINITE, 4: NONFINITE, 5: NONFINITE, 9: NONFINITE,
                   10: NONFINITE}
    mask = torch.zeros(7 * 2, mask_words(V), dtype=torch.int32)  # [B * (K+1), W]
    mask_row = torch.full((n,), -1, dtype=torch.int32)
    slots = list(reversed(range(mask.shape[0])))
    for r in range(n):
        if constrained[r]:
            mask_row[r] = slots.pop()
            mask[mask_row[r]] = pack(legal[r:r + 1])[0]
    z = z.to(dtype)
    return (z.to(device), mask.view(7, 2, -1).to(device), mask_row.to(device), want_status,
            want_tok)


def _device(backend):
    return "cpu" if backend == "interpreter" else "cuda"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("block_v", [128, 256, 1024])
def test_fused_greedy_matches_sample_greedy(backend, dtype, block_v):
    """Constrained and unconstrained rows mixed, DEAD_END, legal NaN / +inf / all -inf, an illegal
    NaN, ties (across chunks, within one, -0.0 against +0.0), the maximum in the last partial chunk,
    V = 1000 (not a multiple of 32 nor of the block), padded logits with garbage past V, the
    generable mask excluding ids that hold the largest value."""
    z, mask, mask_row, want_status, want_tok = scenario(dtype, _device(backend))
    got = fused(z, V, mask, mask_row, NEVER, block_v=block_v)
    assert_same(got, reference(z, V, mask, mask_row, NEVER))
    status, tokens = got.status.tolist(), got.tokens.tolist()
    for r in range(z.shape[0]):
        assert status[r] == want_status.get(r, OK), (r, status[r])
        if r in want_tok:
            assert tokens[r] == want_tok[r], (r, tokens[r])
        if status[r] != OK:
            assert tokens[r] == 0 and got.prob[r] == 0
    # without the generable mask: id 500 (row 0) and the NaN at id 3 (row 11) are read
    plain = fused(z, V, mask, mask_row, block_v=block_v)
    assert_same(plain, reference(z, V, mask, mask_row))
    assert plain.tokens[0] == 500 and plain.status[11] == NONFINITE
    # no mask at all: every row unconstrained, no mask code
    assert_same(fused(z, V, never=NEVER, block_v=block_v), reference(z, V, never=NEVER))


@pytest.mark.parametrize("backend", BACKENDS)
def test_fused_greedy_any_row_stride(backend):
    """Rows of a wider buffer, every other one (row stride 2 * 1100), at a column offset."""
    device = _device(backend)
    z, mask, mask_row, _, _ = scenario(torch.bfloat16, device)
    base = torch.full((2 * z.shape[0], 1100), float("nan"), dtype=z.dtype, device=device)
    base[::2, 7:7 + z.shape[1]] = z
    strided = base[::2, 7:7 + z.shape[1]]
    assert not strided.is_contiguous() and strided.stride(1) == 1
    got = fused(strided, V, mask, mask_row, NEVER, block_v=256)
    assert_same(got, reference(z, V, mask, mask_row, NEVER))


@pytest.mark.parametrize("backend", BACKENDS)
def test_fused_greedy_random_batches(backend):
    """Random small batches with many ties (values on a coarse grid, bf16), random mask
    densities (empty and full included), NaN / +inf / -inf sprinkled, random never-generable ids."""
    device = _device(backend)
    gen = torch.Generator().manual_seed(11)
    for trial in range(24):
        n = int(torch.randint(1, 9, (1,), generator=gen))
        vocab = int(torch.randint(1, 400, (1,), generator=gen))
        pad = int(torch.randint(0, 5, (1,), generator=gen))
        z = torch.randint(-4, 5, (n, vocab + pad), generator=gen).float() / 2
        special = torch.rand(n, vocab + pad, generator=gen)
        z[special < 0.01] = float("nan")
        z[(special >= 0.01) & (special < 0.02)] = float("inf")
        z[(special >= 0.02) & (special < 0.2)] = float("-inf")
        density = torch.rand(n, 1, generator=gen) ** 2
        density[0] = 0.0 if trial % 3 == 0 else density[0]
        legal = torch.rand(n, vocab, generator=gen) < density
        mask = pack(legal)
        mask_row = torch.where(torch.rand(n, generator=gen) < 0.7, torch.arange(n), -1).int()
        never = torch.randperm(vocab, generator=gen)[:int(torch.randint(0, 4, (1,),
                                                                        generator=gen))].tolist()
        dtype = (torch.bfloat16, torch.float32)[trial % 2]
        block = (32, 64, 128, 512)[trial % 4]
        z, mask, mask_row = z.to(dtype).to(device), mask.to(device), mask_row.to(device)
        assert_same(fused(z, vocab, mask, mask_row, never, block_v=block),
                    reference(z, vocab, mask, mask_row, never))
        assert_same(fused(z, vocab, never=never, block_v=block), reference(z, vocab, never=never))


@pytest.mark.parametrize("backend", BACKENDS)
def test_fused_greedy_rejects_bad_inputs(backend):
    from kernels.sampling_greedy_triton import sample_greedy_triton
    device = _device(backend)
    z = torch.zeros(2, 100, device=device)
    with pytest.raises(ValueError, match="vocab_size"):
        sample_greedy_triton(z, vocab_size=101)
    with pytest.raises(ValueError, match="mask_row"):
        sample_greedy_triton(z, vocab_size=100, mask=torch.zeros(2, 4, dtype=torch.int32,
                                                                 device=device))
    with pytest.raises(ValueError, match="generable"):
        sample_greedy_triton(z, vocab_size=100, generable=torch.zeros(3, dtype=torch.int32,
                                                                      device=device))
    with pytest.raises(ValueError, match="block_v"):
        sample_greedy_triton(z, vocab_size=100, block_v=48)
    empty = sample_greedy_triton(z[:0], vocab_size=100)
    assert empty.tokens.shape == (0,) and empty.status.dtype == torch.int32


@pytest.mark.skipif(INTERPRETED, reason="this process is the interpreter run itself")
def test_fused_greedy_under_interpreter():
    """Every `interpreter` case above, in a fresh process under TRITON_INTERPRET=1."""
    run_interpreted(__file__, timeout=600)


# ----------------------------------------------------------------------------- this process


@pytest.mark.skipif(INTERPRETED, reason="torch only")
def test_generable_words_packs_the_complement_of_never():
    words = generable_words(70, [0, 31, 32, 69, 70, 500, -1])  # ids outside [0, V) ignored
    assert words.dtype == torch.int32 and words.shape == (3,)
    bits = ((words[:, None] >> torch.arange(32)) & 1).view(-1)[:96].bool()
    assert [t for t in range(96) if not bits[t]] == [0, 31, 32] + list(range(69, 96))
    assert generable_words(64, None).tolist() == [-1, -1]


@pytest.mark.skipif(INTERPRETED, reason="torch only")
def test_fast_entry_falls_back_to_torch_off_cuda():
    """`sample_greedy_fast` off CUDA (and with penalties, or float64 logits): `sample_greedy` on
    logits with the non-generable ids at -inf: the same result as the fused kernel."""
    z, mask, mask_row, _, _ = scenario(torch.float32, "cpu")
    gen = generable_words(V, list(NEVER))
    assert_same(sample_greedy_fast(z, vocab_size=V, mask=mask, mask_row=mask_row, generable=gen),
                reference(z, V, mask, mask_row, NEVER))
    assert_same(sample_greedy_fast(z.double(), vocab_size=V, generable=gen),
                reference(z, V, never=NEVER))


@pytest.mark.skipif(INTERPRETED, reason="torch only")
def test_sampler_generable_mask_is_its_never_set():
    from services.worker.program.sampling import Sampler
    from tests.support.worker_support import no_z_domain
    domain = no_z_domain()
    sampler = Sampler(domain, torch.device("cpu"))
    bits = ((sampler._generable_mask[:, None] >> torch.arange(32)) & 1).view(-1)[:domain.size]
    assert torch.nonzero(bits == 0)[:, 0].tolist() == sampler._never.tolist()
    assert not sampler._fused_greedy  # the CPU keeps the torch path


# ----------------------------------------------------------------------------- CUDA, real shape


@pytest.mark.parametrize("n", [1, 8, 64])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.skipif(INTERPRETED, reason="native CUDA only")
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fused_greedy_on_cuda_at_the_real_shape(n, masked):
    """V = 248,320 (Qwen3.5's padded vocabulary), bf16 logits padded to 248,384 columns; the fused
    path of `sample_greedy_fast` eagerly and replayed from a CUDA graph equals the torch path."""
    vocab, device = 248_320, "cuda"
    gen = torch.Generator(device=device).manual_seed(n)
    z = torch.randn(n, vocab + 64, device=device, generator=gen).to(torch.bfloat16)
    z[:, vocab:] = float("nan")
    never = list(range(248_044, vocab)) + [151_643]
    z[:, 151_643] = 100.0
    mask = mask_row = None
    if masked:
        legal = torch.rand(n, vocab, device=device, generator=gen) < 0.05
        if n > 1:
            legal[1] = False  # DEAD_END
        mask = pack(legal).to(device).view(n, 1, -1)
        mask_row = torch.where(torch.arange(n, device=device) % 4 == 3, -1,
                               torch.arange(n, device=device)).int()
    want = reference(z, vocab, mask, mask_row, never)
    words = generable_words(vocab, never, device)
    got = sample_greedy_fast(z, vocab_size=vocab, mask=mask, mask_row=mask_row, generable=words)
    assert_same(got, want)
    out = {}
    graph = torch.cuda.CUDAGraph()
    sample_greedy_fast(z, vocab_size=vocab, mask=mask, mask_row=mask_row, generable=words)
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        out["r"] = sample_greedy_fast(z, vocab_size=vocab, mask=mask, mask_row=mask_row,
                                      generable=words)
    z[:, :vocab] = torch.randn(n, vocab, device=device, generator=gen).to(torch.bfloat16)
    z[:, 7] = 200.0  # new values in the same buffer
    graph.replay()
    torch.cuda.synchronize()
    assert_same(out["r"], reference(z, vocab, mask, mask_row, never))
