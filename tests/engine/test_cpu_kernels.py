"""spectune's CPU kernels (``backends/local/kernels``): decode attention and the per-row int8 linear against float32
references, each row's result independent of the rows and cache lengths beside it, the build for other vector ISAs
(AVX2, scalar) through ``ATEN_CPU_CAPABILITY``, and what happens without a compiler."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

from spectune.backends.local import kernels
from spectune.core.errors import UserError

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def ops() -> kernels.KernelChoice:
    choice = kernels.load("auto", CPU)
    if not choice.active:
        pytest.skip(f"spectune's CPU kernels are not available here: {choice.reason}")
    return choice


def _attention_case(batch: int, s: int, visible: list[int], length: int, dtype: torch.dtype, seed: int = 0):
    """q [B, Hkv, G*s, hd], caches [slots, Hkv, L, hd], mask [B, 1, G*s, T] where sequence b sees positions
    < visible[b] + j for its j-th new token (the engine's causal layout), T = max(visible) + s - 1."""
    g = torch.Generator().manual_seed(seed)
    hkv, group, hd = 3, 3, 64
    kc = torch.randn(batch + 1, hkv, length, hd, generator=g).to(dtype)
    vc = torch.randn(batch + 1, hkv, length, hd, generator=g).to(dtype)
    q = torch.randn(batch, hkv, group * s, hd, generator=g).to(dtype)
    positions = torch.tensor([[v - 1 + j for j in range(s)] for v in visible])  # [B, s]
    t = int(positions.max()) + 1
    mask = torch.arange(t).view(1, 1, t) <= positions.unsqueeze(-1)  # [B, s, T]
    mask = mask.unsqueeze(1).repeat(1, 1, group, 1)  # row g*s + j -> token j, as attend_batched builds it
    return q, kc, vc, mask


@pytest.mark.parametrize("batch,s,visible,length", [(1, 1, [37], 64), (1, 1, [200], 256), (3, 4, [5, 64, 17], 80),
                                                    (2, 2, [40, 33], 41)])
def test_decode_attention_matches_float32_sdpa(ops, batch, s, visible, length) -> None:
    q, kc, vc, mask = _attention_case(batch, s, visible, length, torch.bfloat16)
    t = mask.shape[-1]
    ref = F.scaled_dot_product_attention(q.float(), kc[:batch, :, :t].float(), vc[:batch, :, :t].float(),
                                         attn_mask=mask)
    out = torch.ops.spectune.decode_attention(q, kc, vc, mask)
    assert (out.float() - ref).abs().max().item() < 1e-2  # bf16 output: 2^-8 of values around 1


def test_decode_attention_float32_is_close_to_sdpa(ops) -> None:
    q, kc, vc, mask = _attention_case(2, 3, [30, 50], 64, torch.float32)
    t = mask.shape[-1]
    ref = F.scaled_dot_product_attention(q, kc[:2, :, :t], vc[:2, :, :t], attn_mask=mask)
    assert torch.allclose(torch.ops.spectune.decode_attention(q, kc, vc, mask), ref, atol=2e-6, rtol=1e-5)


def test_decode_attention_row_ignores_longer_neighbours(ops) -> None:
    """A sequence's output is bit-identical whatever the longest sequence in its batch (T) is: one that sees 37
    positions, alone (T = 37) and with masks as long as 48, 64, 100 and 128 (the cache's end, L = 128)."""
    q, kc, vc, _ = _attention_case(1, 1, [37], 128, torch.bfloat16)
    outs = []
    for t in (37, 48, 64, 100, 128):
        mask = torch.zeros(1, 1, q.shape[2], t, dtype=torch.bool)
        mask[..., :37] = True
        outs.append(torch.ops.spectune.decode_attention(q, kc, vc, mask))
    assert all(torch.equal(outs[0], o) for o in outs[1:])


def test_decode_attention_row_ignores_batch_neighbours(ops) -> None:
    q, kc, vc, mask = _attention_case(3, 2, [20, 90, 45], 96, torch.bfloat16)
    batched = torch.ops.spectune.decode_attention(q, kc, vc, mask)
    alone = torch.ops.spectune.decode_attention(q[2:3], kc[2:3], vc[2:3], mask[2:3, ..., :46])
    assert torch.equal(batched[2:3], alone)


def test_decode_attention_fully_masked_row_is_zero(ops) -> None:
    q, kc, vc, mask = _attention_case(1, 1, [10], 32, torch.bfloat16)
    out = torch.ops.spectune.decode_attention(q, kc, vc, torch.zeros_like(mask))
    assert torch.count_nonzero(out).item() == 0


def test_decode_attention_rejects_a_bad_mask(ops) -> None:
    q, kc, vc, mask = _attention_case(1, 1, [10], 32, torch.bfloat16)
    with pytest.raises(RuntimeError, match="mask must be bool"):
        torch.ops.spectune.decode_attention(q, kc, vc, mask.float())


def _int8_case(m: int, n: int, k: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).bfloat16()
    codes = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
    scale = (torch.rand(n, generator=g) * 0.01 + 1e-4).bfloat16()
    ref = (x.float() @ codes.float().T) * scale.float()
    return x, codes, scale, ref


@pytest.mark.parametrize("m,n,k", [(1, 4096, 576), (4, 1003, 576), (16, 256, 64), (3, 40, 48)])
def test_int8_linear_matches_float32(ops, m, n, k) -> None:
    """Against (x @ codes^T) * scale in float32: within one bf16 rounding of the output (K 48 is not a multiple of
    32: the float32 variant; N 1003 and 40 leave a tail of weight rows)."""
    x, codes, scale, ref = _int8_case(m, n, k)
    out = torch.ops.spectune.int8_linear(x, codes, scale).float()
    assert ((out - ref).abs() <= ref.abs() * 2**-8 + 1e-3 * ref.abs().max()).all()


def test_int8_linear_row_ignores_batch_neighbours(ops) -> None:
    x, codes, scale, _ = _int8_case(5, 1000, 576)
    batched = torch.ops.spectune.int8_linear(x, codes, scale)
    assert torch.equal(batched[3:4], torch.ops.spectune.int8_linear(x[3:4], codes, scale))


def _int4_case(n: int, k: int, repeat: int):
    """Q4_1-shaped random weights [n, k] (``repeat`` 2: a Q8_0 matrix as two int4 halves)."""
    import numpy as np

    from spectune.backends.local.weights.quant import QuantTensor

    rng = np.random.default_rng(0)
    return QuantTensor(rng.integers(0, 16, (n, k * repeat), dtype=np.uint8),
                       (rng.random((n, k * repeat // 32)) * 0.02).astype(np.float32),
                       (rng.standard_normal((n, k * repeat // 32)) * 0.01).astype(np.float32), repeat, "Q4_1")


@pytest.mark.parametrize("n,k,repeat", [(3072, 576, 1), (576, 1536, 1), (1024, 576, 2)])
def test_int4_linear_computes_its_formula(ops, n, k, repeat) -> None:
    """float32 inputs against :func:`int4_blocks_reference` in float64 (the int16 inputs and integer dot products
    exact, only float32 accumulation between groups), for Q4_1-shaped weights and a Q8_0 matrix as two halves."""
    from spectune.backends.local.weights.quant import Int4Linear, int4_blocks_reference

    if not ops.int4:
        pytest.skip("spectune::int4_linear needs an AVX-512 BW build")
    qt = _int4_case(n, k, repeat)
    x = torch.randn(11, k, generator=torch.Generator().manual_seed(2))
    ref = int4_blocks_reference(qt, x.repeat(1, repeat))
    out = Int4Linear(qt, torch.float32, spectune_kernel=True)(x).double()
    assert ((out - ref).abs().max() / ref.abs().max()).item() < 1e-5


def test_int4_linear_is_as_close_to_the_weights_product_as_pytorchs_kernel(ops) -> None:
    """Against the float64 product of the very weights each kernel keeps, with bf16 inputs: the int16 inputs (an error
    of 1/65534 of a group's largest input) leave the output within bf16's rounding of it, like PyTorch's kernel."""
    from spectune.backends.local.weights.quant import Int4Linear, int4_block_weights

    if not ops.int4:
        pytest.skip("spectune::int4_linear needs an AVX-512 BW build")
    qt = _int4_case(3072, 576, 1)
    x = torch.randn(8, 576, generator=torch.Generator().manual_seed(3)).bfloat16()

    def error(layer: Int4Linear, weights: torch.Tensor) -> float:
        true = x.double() @ weights.double().T
        return ((layer(x).double() - true).abs() / true.abs().max()).max().item()

    mine = error(Int4Linear(qt, spectune_kernel=True), torch.from_numpy(int4_block_weights(qt)))
    theirs = error(Int4Linear(qt), torch.from_numpy(qt.rounded(torch.bfloat16).dequantize()))
    assert mine <= max(theirs, 2**-8)


def test_int4_linear_row_ignores_batch_neighbours(ops) -> None:
    """A row's output is bit-identical whatever the rows beside it (1 to 11 rows: partial and full passes of 8)."""
    from spectune.backends.local.weights.quant import Int4Linear

    if not ops.int4:
        pytest.skip("spectune::int4_linear needs an AVX-512 BW build")
    layer = Int4Linear(_int4_case(1024, 576, 1), spectune_kernel=True)
    x = torch.randn(11, 576, generator=torch.Generator().manual_seed(4)).bfloat16()
    full = layer(x)
    assert all(torch.equal(full[:m], layer(x[:m])) for m in (1, 3, 4, 5, 8))
    assert torch.equal(full[9:10], layer(x[9:10]))


def test_off_keeps_pytorch_kernels() -> None:
    choice = kernels.load("off", CPU)
    assert (choice.active, choice.to_json()["mode"]) == (False, "off")


def test_unknown_mode_is_a_user_error() -> None:
    with pytest.raises(UserError, match="--cpu-kernels 'fast': use auto, on or off"):
        kernels.load("fast", CPU)


_CHECK = textwrap.dedent("""
    import sys, torch, torch.nn.functional as F
    from spectune.backends.local import kernels
    from spectune.core.errors import UserError
    try:
        choice = kernels.load(sys.argv[1], torch.device("cpu"))
    except UserError as err:
        print("USERERROR", err); raise SystemExit(0)
    print("ACTIVE", choice.active, choice.vector_width, choice.reason)
    if choice.active:
        g = torch.Generator().manual_seed(1)
        kc = torch.randn(3, 3, 70, 64, generator=g).bfloat16(); vc = torch.randn(3, 3, 70, 64, generator=g).bfloat16()
        q = torch.randn(2, 3, 6, 64, generator=g).bfloat16()
        mask = torch.rand(2, 1, 6, 69, generator=g) > 0.3
        ref = F.scaled_dot_product_attention(q.float(), kc[:2, :, :69].float(), vc[:2, :, :69].float(), attn_mask=mask)
        print("ATTN", (torch.ops.spectune.decode_attention(q, kc, vc, mask).float() - ref).abs().max().item())
        x = torch.randn(3, 576, generator=g).bfloat16(); w = torch.randint(-127, 128, (300, 576), generator=g,
                                                                         dtype=torch.int8)
        s = torch.full((300,), 0.01).bfloat16()
        ref = (x.float() @ w.float().T) * s.float()
        err = ((torch.ops.spectune.int8_linear(x, w, s).float() - ref).abs() / ref.abs().max()).max().item()
        print("INT8", err)
""")


def _run_check(mode: str, **env: str) -> str:
    done = subprocess.run([sys.executable, "-c", _CHECK, mode], capture_output=True, text=True, timeout=600,
                          env={**os.environ, **env})
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.mark.parametrize("capability,width", [("avx2", "8"), ("default", "1")])
def test_other_isa_builds_compute_the_same(ops, capability, width) -> None:
    """``ATEN_CPU_CAPABILITY`` builds the kernels for that ISA (``-march=x86-64-v3``: 8 float lanes, no int16 dot;
    ``-march=x86-64``: the scalar code), and those compute what the AVX-512 build does, within bf16 rounding."""
    if os.uname().machine != "x86_64":
        pytest.skip("the ISA overrides are x86 names")
    lines = dict(ln.split(" ", 1) for ln in _run_check("on", ATEN_CPU_CAPABILITY=capability).splitlines())
    assert lines["ACTIVE"].split()[:2] == ["True", width]
    assert float(lines["ATTN"]) < 1e-2
    assert float(lines["INT8"]) < 2**-7


def test_without_a_compiler_auto_falls_back_and_on_is_an_error(tmp_path) -> None:
    env = {"CXX": str(tmp_path / "no-such-compiler")}
    assert "ACTIVE False 0 no C++ compiler" in _run_check("auto", **env)
    assert "USERERROR --cpu-kernels on: no C++ compiler" in _run_check("on", **env)
