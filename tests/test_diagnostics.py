"""Tests of the kernel-PCA diagnostics: projection loss, eigenvector check, attention capture."""

import math

import numpy as np
import pytest
import torch

from invariant_cluster import KernelPCAAttention
from invariant_cluster.attention import (
    RPCAttention,
    VisionTransformer,
    principal_attention_pursuit,
)
from invariant_cluster.diagnostics import capture_attention, eigenvector_check, projection_loss


@pytest.fixture
def qk():
    rng = np.random.RandomState(0)
    return rng.normal(size=(25, 6)), rng.normal(size=(30, 6))


def _kernel_terms(Q, K, s):
    """||varphi(q)||^2, H k_phi(q, .) and Kc, in float64 straight from the definitions."""
    n = K.shape[0]
    Ek = np.exp(s * K @ K.T)
    gk = Ek.sum(1)
    Eq = np.exp(s * Q @ K.T)
    gq = Eq.sum(1)
    Hn = np.eye(n) - 1.0 / n
    Kc = Hn @ (Ek / np.outer(gk, gk)) @ Hn
    b = (Eq / np.outer(gq, gk)) @ Hn  # rows: (I - 1_N) k_phi(q, k_.)
    phi_sq = np.exp(s * (Q * Q).sum(1)) / gq**2
    return phi_sq, b, Kc


class TestProjectionLoss:
    def test_exact_kpca_values_closed_form(self, qk):
        Q, K = qk
        est = KernelPCAAttention(scale="attention", device="cpu").fit(K)  # all N - 1 components
        out = projection_loss(Q, K, est.values_)
        phi_sq, b, Kc = _kernel_terms(Q, K, 1 / math.sqrt(6))
        # Residual of varphi(q) off the span of the centred features: ||varphi||^2 - b Kc^+ b.
        closed = phi_sq - np.einsum("ij,jk,ik->i", b, np.linalg.pinv(Kc, hermitian=True), b)
        assert out["j_proj"].shape == (25,)
        assert np.all(out["j_proj"] >= -1e-15)
        np.testing.assert_allclose(out["phi_q_sq_norm"], phi_sq, rtol=1e-12)
        np.testing.assert_allclose(out["j_proj"], closed, atol=1e-12)
        assert out["mean_j_proj"] == pytest.approx(closed.mean(), abs=1e-12)
        assert out["loss"] == out["mean_j_proj"] and out["form"] == "consistent"
        # On the keys themselves, the span holds varphi(k_j) up to the mean: a smaller residual.
        on_keys = projection_loss(K, K, est.values_)
        assert np.all(on_keys["j_proj"] >= -1e-15)

    def test_fewer_components_larger_loss(self, qk):
        Q, K = qk
        losses = [
            projection_loss(Q, K, KernelPCAAttention(n_components=m, scale="attention",
                                                     device="cpu").fit(K).values_)["mean_j_proj"]
            for m in (2, 8, 29)
        ]
        assert losses[0] > losses[1] > losses[2] >= 0

    def test_random_values_terms(self, qk):
        """REFERENCE.md: the phi term does not see V, ||h||^2 does and dominates; J can be < 0."""
        Q, K = qk
        V = np.random.RandomState(1).normal(size=(30, 6))
        a = projection_loss(Q, K, V)
        b = projection_loss(Q, K, 10 * V)
        np.testing.assert_array_equal(a["phi_q_sq_norm"], b["phi_q_sq_norm"])
        np.testing.assert_allclose(b["h_sq_norm"], 100 * a["h_sq_norm"], rtol=1e-12)
        assert a["mean_h_sq_norm"] > 10 * a["mean_phi_q_sq_norm"]
        assert a["mean_j_proj"] < 0
        np.testing.assert_allclose(a["j_proj"], a["phi_q_sq_norm"] - a["h_sq_norm"])

    def test_official_form(self, qk):
        Q, K = qk
        est = KernelPCAAttention(scale="attention", device="cpu").fit(K)
        off = projection_loss(Q, K, est.values_, form="official")
        con = projection_loss(Q, K, est.values_)
        phi_unscaled, *_ = _kernel_terms(Q, K, 1.0)
        np.testing.assert_allclose(off["phi_q_sq_norm"], phi_unscaled, rtol=1e-12)
        np.testing.assert_array_equal(off["h_sq_norm"], con["h_sq_norm"])
        assert off["mean_j_proj"] > 0
        assert off["loss"] == pytest.approx(math.log(off["mean_j_proj"]))
        negative = projection_loss(Q, K, 10 * est.values_, form="official")
        assert negative["mean_j_proj"] < 0 and math.isnan(negative["loss"])
        # With scale 1 both forms compute the same terms.
        a = projection_loss(Q, K, est.values_, scale=1.0)
        b = projection_loss(Q, K, est.values_, scale=1.0, form="official")
        np.testing.assert_allclose(a["j_proj"], b["j_proj"])
        assert b["loss"] == pytest.approx(math.log(a["mean_j_proj"]))

    def test_batched_torch_and_large_logits(self):
        gen = torch.Generator().manual_seed(0)
        Q = torch.randn(2, 3, 17, 8, generator=gen) * 30  # logits far beyond exp's range
        V = torch.randn(2, 3, 17, 8, generator=gen)
        out = projection_loss(Q.float(), Q.float(), V)
        assert out["j_proj"].shape == (2, 3, 17)
        assert isinstance(out["j_proj"], np.ndarray)
        assert np.isfinite(out["j_proj"]).all()

    def test_bad_input(self, qk):
        Q, K = qk
        V = np.ones((30, 4))
        with pytest.raises(ValueError, match="Q: expected shape"):
            projection_loss(Q[:, :5], K, V)
        with pytest.raises(ValueError, match="V: expected one value per key"):
            projection_loss(Q, K, V[:29])
        bad = K.copy()
        bad[0, 0] = np.nan
        with pytest.raises(ValueError, match="K: contains NaN"):
            projection_loss(Q, bad, V)
        with pytest.raises(ValueError, match="form"):
            projection_loss(Q, K, V, form="paper")
        with pytest.raises(ValueError, match="scale"):
            projection_loss(Q, K, V, scale=0.0)
        with pytest.raises(ValueError, match="Q"):
            projection_loss(Q.astype(complex), K, V)


class TestEigenvectorCheck:
    def test_exact_values_at_round_off(self, qk):
        _, K = qk
        est = KernelPCAAttention(n_components=6, scale="attention", device="cpu").fit(K)
        out = eigenvector_check(K, est.values_, random_state=0)
        n_lambda = K.shape[0] * est.eigenvalues_
        np.testing.assert_allclose(out["eigenvalue"], n_lambda, rtol=1e-10)
        np.testing.assert_allclose(out["gamma_median"], n_lambda, rtol=1e-9)
        assert np.all(out["abs_diff_mean"] < 1e-9 * n_lambda)
        assert np.all(out["rel_diff_mean"] < 1e-9)
        assert np.all(out["abs_diff_mean"] < 1e-8 * out["random_abs_diff_mean"])
        assert np.all(out["random_rel_diff_mean"] > 0.1)

    def test_random_values_like_baseline(self, qk):
        _, K = qk
        V = np.random.RandomState(2).normal(size=(30, 4))
        out = eigenvector_check(K, V, n_random=20, random_state=0)
        assert set(out) >= {"abs_diff_std", "rel_diff_std", "random_abs_diff_std",
                            "random_rel_diff_std"}
        ratio = out["rel_diff_mean"] / out["random_rel_diff_mean"]
        assert np.all((ratio > 0.5) & (ratio < 2))
        again = eigenvector_check(K, V, n_random=20, random_state=0)
        np.testing.assert_array_equal(out["random_abs_diff_mean"], again["random_abs_diff_mean"])

    def test_batched_shapes(self):
        rng = np.random.RandomState(3)
        out = eigenvector_check(rng.normal(size=(2, 3, 5, 4)), rng.normal(size=(2, 3, 5, 7)))
        assert out["abs_diff_mean"].shape == (2, 3, 7)
        assert np.isnan(out["eigenvalue"][..., 5:]).all()

    def test_bad_input(self, qk):
        _, K = qk
        with pytest.raises(ValueError, match="V: expected one value per key"):
            eigenvector_check(K, np.ones((29, 3)))
        with pytest.raises(ValueError, match="n_random"):
            eigenvector_check(K, np.ones((30, 3)), n_random=0)
        with pytest.raises(ValueError, match="K: expected at least 2 keys"):
            eigenvector_check(K[:1], np.ones((1, 3)))


def _mha_reference(mha, q, k, v):
    """softmax attention of captured arrays, heads merged, then ``out_proj``."""
    q, k, v = (torch.as_tensor(a) for a in (q, k, v))
    heads = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1) @ v
    b, h, n, d = heads.shape
    return mha.out_proj(heads.transpose(1, 2).reshape(b, n, h * d))


class TestCaptureAttention:
    @pytest.mark.parametrize("batch_first", [True, False])
    def test_multihead_attention_self(self, batch_first):
        mha = torch.nn.MultiheadAttention(12, 3, batch_first=batch_first).eval()
        x = torch.randn(4, 6, 12, generator=torch.Generator().manual_seed(0))
        inp = x if batch_first else x.transpose(0, 1)
        rec = capture_attention(mha, (inp, inp, inp))
        assert list(rec) == [""]
        r = rec[""]
        assert r["q"].shape == (4, 3, 6, 4) and r["module"] == "MultiheadAttention"
        out, _ = mha(inp, inp, inp)
        out = out if batch_first else out.transpose(0, 1)
        with torch.no_grad():
            torch.testing.assert_close(_mha_reference(mha, r["q"], r["k"], r["v"]), out)
        assert not mha._forward_hooks

    def test_multihead_attention_cross_kdim_bias_kv(self):
        mha = torch.nn.MultiheadAttention(8, 2, kdim=5, vdim=3, add_bias_kv=True,
                                          add_zero_attn=True, batch_first=True).eval()
        gen = torch.Generator().manual_seed(1)
        q, k, v = torch.randn(2, 4, 8, generator=gen), torch.randn(2, 7, 5, generator=gen), \
            torch.randn(2, 7, 3, generator=gen)
        r = capture_attention(mha, {"query": q, "key": k, "value": v})[""]
        assert r["q"].shape == (2, 2, 4, 4) and r["k"].shape == (2, 2, 9, 4)
        out, _ = mha(q, k, v)
        with torch.no_grad():
            torch.testing.assert_close(_mha_reference(mha, r["q"], r["k"], r["v"]), out)

    def test_multihead_attention_in_a_model(self):
        class Encoder(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.layer = torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0,
                                                              batch_first=True)

            def forward(self, x):
                return self.layer(x)

        model = Encoder().eval()
        x = torch.randn(3, 5, 8, generator=torch.Generator().manual_seed(2))
        rec = capture_attention(model, x)
        assert list(rec) == ["layer.self_attn"]
        mha = model.layer.self_attn
        expected, _ = mha(model.layer.norm1(x) if model.layer.norm_first else x, x, x)
        with torch.no_grad():
            r = rec["layer.self_attn"]
            torch.testing.assert_close(_mha_reference(mha, r["q"], r["k"], r["v"]), expected)

    @pytest.mark.parametrize("attention", ["softmax", "symmetric", "rpc"])
    def test_package_modules(self, attention):
        model = VisionTransformer(8, 4, 12, 2, 3, 5, attention=attention, random_state=0).eval()
        x = torch.rand(2, 1, 8, 8, generator=torch.Generator().manual_seed(3))
        outputs = {}
        hooks = [
            blk.attn.register_forward_hook(
                lambda m, a, o, i=i: outputs.__setitem__(f"blocks.{i}.attn", o)
            )
            for i, blk in enumerate(model.blocks)
        ]
        rec = capture_attention(model, x)
        for h in hooks:
            h.remove()
        assert list(rec) == ["blocks.0.attn", "blocks.1.attn"]
        for name, r in rec.items():
            module = model.get_submodule(name)
            q, k, v = (torch.as_tensor(r[key]) for key in ("q", "k", "v"))
            assert q.shape == (2, 3, 5, 4)
            if isinstance(module, RPCAttention):
                heads = principal_attention_pursuit(k, v, n_iter=4, lam=4.0, embed_dim=12)
            else:
                heads = torch.softmax(r["scale"] * q @ k.transpose(-2, -1), dim=-1) @ v
            with torch.no_grad():
                out = module.proj(heads.transpose(1, 2).reshape(2, 5, 12))
            torch.testing.assert_close(out, outputs[name])

    def test_bad_model(self):
        with pytest.raises(TypeError, match="model"):
            capture_attention(lambda x: x, torch.zeros(1))


class TestPrecomputedKernel:
    """``kernel=``: the same numbers as the built-in softmax kernel when given exp(s x.y)."""

    def test_projection_loss_softmax_kernel_given(self, qk):
        Q, K = qk
        V = np.random.RandomState(2).normal(size=(30, 4))
        s = 1 / math.sqrt(6)
        ref = projection_loss(Q, K, V)
        out = projection_loss(Q, K, V, kernel=np.exp(s * Q @ K.T),
                              kernel_diag=np.exp(s * (Q * Q).sum(1)))
        for key in ("phi_q_sq_norm", "h_sq_norm", "j_proj"):
            np.testing.assert_allclose(out[key], ref[key], rtol=1e-10)

    def test_eigenvector_check_softmax_kernel_given(self, qk):
        _, K = qk
        V = KernelPCAAttention(n_components=4, scale="attention", device="cpu").fit(K).values_
        ref = eigenvector_check(K, V, random_state=0)
        out = eigenvector_check(K, V, random_state=0,
                                kernel=np.exp(K @ K.T / math.sqrt(6)))
        for key in ("eigenvalue", "gamma_median", "rel_diff_mean", "random_rel_diff_mean"):
            np.testing.assert_allclose(out[key], ref[key], rtol=1e-8, atol=1e-14)

    def test_bad_kernel(self, qk):
        Q, K = qk
        V = np.ones((30, 2))
        with pytest.raises(ValueError, match="kernel"):
            projection_loss(Q, K, V, kernel=np.ones((25, 29)))
        with pytest.raises(ValueError, match="form"):
            projection_loss(Q, K, V, kernel=np.ones((25, 30)), form="official")
        with pytest.raises(ValueError, match="kernel_diag"):
            projection_loss(Q, K, V, kernel=np.ones((25, 30)), kernel_diag=np.ones(3))
        with pytest.raises(ValueError, match="kernel"):
            eigenvector_check(K, V, kernel=-np.ones((30, 30)))
        with pytest.raises(ValueError, match="kernel"):
            eigenvector_check(K[None], V[None], kernel=np.ones((30, 30)))
