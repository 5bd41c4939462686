"""Tests of the attention modules and of Principal Attention Pursuit."""

import math

import numpy as np
import pytest
import torch

from invariant_cluster.attention import (
    RPCAttention,
    SoftmaxAttention,
    SymmetricAttention,
    VisionTransformer,
    principal_attention_pursuit,
)


def _randn(*shape, seed=0, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen, dtype=dtype)


def _reinit(module, seed=0):
    """Deterministic weights from a local generator (module defaults use the global RNG)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    return module


def _softmax_attention(q, k, v, scale):
    return torch.softmax(scale * q @ k.transpose(-2, -1), dim=-1) @ v


def _pap_reference(K, V, n_iter, lam, width):
    """PAP written out per head in NumPy float64, line by line from REFERENCE.md."""
    K, V = np.asarray(K, dtype=np.float64), np.asarray(V, dtype=np.float64)
    out = np.empty_like(K)
    n, d = K.shape[-2:]
    s = 1 / math.sqrt(d)
    for idx in np.ndindex(K.shape[:-2]):
        k, v = K[idx], V[idx]
        mu = n * width / (4 * np.abs(k).sum())
        L = np.zeros_like(k)
        Y = np.zeros_like(k)
        for _ in range(n_iter):
            x = k - L + Y / mu
            S = np.sign(x) * np.maximum(np.abs(x) - lam * mu, 0)
            Kh = k - S - Y / mu
            logits = s * Kh @ Kh.T
            w = np.exp(logits - logits.max(1, keepdims=True))
            L = (w / w.sum(1, keepdims=True)) @ v
            Y = Y + mu * (k - L - S)
        out[idx] = L
    return out


class TestPrincipalAttentionPursuit:
    def test_matches_reference(self):
        K, V = _randn(2, 3, 9, 4, seed=1), _randn(2, 3, 9, 4, seed=2)
        out = principal_attention_pursuit(K, V, n_iter=4, lam=0.5, embed_dim=12)
        np.testing.assert_allclose(out.numpy(), _pap_reference(K, V, 4, 0.5, 12), atol=1e-12)

    def test_one_iteration_is_attention_over_clipped_keys(self):
        K, V = _randn(2, 16, 8, seed=3), _randn(2, 16, 8, seed=4)
        lam = 0.05
        mu = 16 * 8 / (4 * K.abs().sum(dim=(-2, -1), keepdim=True))
        assert (K.abs() > lam * mu).any()  # the clipping is active
        Kc = torch.maximum(torch.minimum(K, lam * mu), -lam * mu)
        expected = _softmax_attention(Kc, Kc, V, 1 / math.sqrt(8))
        out = principal_attention_pursuit(K, V, n_iter=1, lam=lam)
        torch.testing.assert_close(out, expected, atol=1e-14, rtol=1e-12)

    def test_huge_lam_is_symmetric_softmax_attention(self):
        K, V = _randn(3, 10, 4, seed=5), _randn(3, 10, 4, seed=6)
        expected = _softmax_attention(K, K, V, 0.5)
        for lam in (1e12, math.inf):
            out, S = principal_attention_pursuit(K, V, n_iter=1, lam=lam, return_sparse=True)
            torch.testing.assert_close(out, expected, atol=1e-14, rtol=1e-12)
            assert torch.count_nonzero(S) == 0
        # Documented: later iterations attend with Kh = L, so more iterations differ.
        out2 = principal_attention_pursuit(K, V, n_iter=2, lam=math.inf)
        torch.testing.assert_close(out2, _softmax_attention(expected, expected, V, 0.5))

    def test_explicit_mu_and_scale(self):
        K, V = _randn(12, 6, seed=7), _randn(12, 6, seed=8)
        mu = 12 * 24 / (4 * K.abs().sum())
        a = principal_attention_pursuit(K, V, n_iter=3, lam=1.0, embed_dim=24)
        b = principal_attention_pursuit(K, V, n_iter=3, lam=1.0, mu=float(mu))
        torch.testing.assert_close(a, b)
        c = principal_attention_pursuit(K, V, n_iter=1, lam=math.inf, scale=0.1)
        torch.testing.assert_close(c, _softmax_attention(K, K, V, 0.1))

    def test_shapes_dtype_and_gradients(self):
        K = _randn(2, 2, 5, 3, seed=9).requires_grad_()
        V = _randn(2, 2, 5, 3, seed=10).requires_grad_()
        out = principal_attention_pursuit(K, V, n_iter=2, lam=0.3)
        assert out.shape == K.shape and out.dtype == torch.float64
        assert torch.autograd.gradcheck(
            lambda k, v: principal_attention_pursuit(k, v, n_iter=2, lam=0.3), (K, V)
        )
        f32 = principal_attention_pursuit(K.detach().float(), V.detach().float())
        assert f32.dtype == torch.float32

    def test_bad_input(self):
        K = _randn(4, 3)
        with pytest.raises(ValueError, match="V: expected the keys' shape"):
            principal_attention_pursuit(K, _randn(4, 2))
        with pytest.raises(ValueError, match="n_iter"):
            principal_attention_pursuit(K, K, n_iter=0)
        with pytest.raises(ValueError, match="lam"):
            principal_attention_pursuit(K, K, lam=-1.0)
        with pytest.raises(TypeError, match="K, V"):
            principal_attention_pursuit(K.numpy(), K)
        with pytest.raises(ValueError, match="K: expected shape"):
            principal_attention_pursuit(K[0], K[0])


class TestModules:
    @pytest.mark.parametrize("cls", [SoftmaxAttention, SymmetricAttention, RPCAttention])
    def test_compute_qkv_drives_forward(self, cls):
        module = _reinit(cls(12, 3)).double()
        x = _randn(2, 7, 12, seed=11)
        q, k, v = module.compute_qkv(x)
        assert q.shape == k.shape == v.shape == (2, 3, 7, 4)
        if cls is RPCAttention:
            heads = principal_attention_pursuit(k, v, n_iter=4, lam=4.0, embed_dim=12)
        else:
            heads = _softmax_attention(q, k, v, 0.5)
        expected = module.proj(heads.transpose(1, 2).reshape(2, 7, 12))
        torch.testing.assert_close(module(x), expected)
        if cls is not SoftmaxAttention:
            assert q is k

    def test_rpc_one_iteration_no_shrinkage_equals_symmetric(self):
        sym = _reinit(SymmetricAttention(8, 2)).double()
        rpc = RPCAttention(8, 2, n_iter=1, lam=math.inf).double()
        rpc.load_state_dict(sym.state_dict())
        x = _randn(3, 5, 8, seed=12)
        torch.testing.assert_close(rpc(x), sym(x))

    def test_bad_arguments(self):
        with pytest.raises(ValueError, match="num_heads"):
            SoftmaxAttention(10, 3)
        with pytest.raises(ValueError, match="x: expected shape"):
            SoftmaxAttention(8, 2)(torch.zeros(2, 3, 6))
        with pytest.raises(ValueError, match="lam"):
            RPCAttention(8, 2, lam=0.0)


class TestVisionTransformer:
    def test_shapes_layers_and_gradients(self):
        model = VisionTransformer(28, 7, 16, 2, 2, 10, attention="rpc", random_state=0)
        assert isinstance(model.blocks[0].attn, RPCAttention)
        assert type(model.blocks[1].attn) is SymmetricAttention
        x = torch.rand(3, 1, 28, 28)
        logits = model(x)
        assert logits.shape == (3, 10)
        logits.sum().backward()
        assert all(p.grad is not None for p in model.parameters())
        assert model(x[:, 0]).shape == (3, 10)  # (B, H, W) is accepted

    def test_same_random_state_same_start(self):
        state = torch.get_rng_state()
        sym = VisionTransformer(8, 4, 8, 2, 2, 3, attention="symmetric", random_state=5)
        rpc = VisionTransformer(8, 4, 8, 2, 2, 3, attention="rpc", random_state=5)
        other = VisionTransformer(8, 4, 8, 2, 2, 3, attention="symmetric", random_state=6)
        for (na, a), (nb, b) in zip(sym.state_dict().items(), rpc.state_dict().items()):
            assert na == nb
            torch.testing.assert_close(a, b)
        assert not torch.equal(sym.head.weight, other.head.weight)
        assert type(VisionTransformer(8, 4, 8, 1, 2, 3).blocks[0].attn) is SoftmaxAttention
        assert torch.equal(torch.get_rng_state(), state)  # the global generator is untouched

    def test_bad_arguments(self):
        with pytest.raises(ValueError, match="patch_size"):
            VisionTransformer(28, 5, 16, 2, 2, 10)
        with pytest.raises(ValueError, match="attention"):
            VisionTransformer(28, 7, 16, 2, 2, 10, attention="linear")
        with pytest.raises(ValueError, match="rpc_layers"):
            VisionTransformer(28, 7, 16, 2, 2, 10, attention="rpc", rpc_layers=(2,))
        with pytest.raises(ValueError, match="images: expected shape"):
            VisionTransformer(28, 7, 16, 1, 2, 10)(torch.zeros(2, 1, 14, 14))
