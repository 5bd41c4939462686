"""Diagnostics of the kernel-PCA reading of attention: projection loss, eigenvector check, capture.

Pure functions: NumPy arrays or torch tensors in, NumPy out. The maths runs in float64 on the CPU.

Convention
----------
One head: queries ``q_i`` ``(M, D)``, keys ``k_j`` and values ``v_j`` (``N`` of each), scale
``s = 1 / sqrt(D)`` unless given. Leading dimensions ``(...)`` (batch, heads) are carried through:
``Q`` is ``(..., M, D)``, ``K`` is ``(..., N, D)`` and ``V`` is ``(..., N, m)``. The symbols are
those of :mod:`invariant_cluster.decomposition`: ``g(x) = sum_j exp(s x.k_j)``,
``varphi(x) = phi(x) / g(x)``, ``K_phi``, ``Kc = (I - 1_N) K_phi (I - 1_N)``.
"""

from __future__ import annotations

import math
import numbers

import numpy as np
import scipy.sparse as sp
import torch
from sklearn.utils import check_random_state

from ._utils import as_array, check_real_dtype, to_tensor
from .decomposition import (
    _centre,
    _centred_apply,
    _leading_eigen,
    _log_normalisers,
    _normalised_gram,
    _sparse_normalised_gram,
)

__all__ = ["projection_loss", "eigenvector_check", "capture_attention"]


def _as_float64(x, name):
    """A float64 CPU tensor of ``x`` (NumPy or torch), with a clear error for bad input."""
    if isinstance(x, torch.Tensor):
        check_real_dtype(x.dtype, name)
        t = x.detach().to(device="cpu", dtype=torch.float64)
    else:
        a = as_array(x, name)
        check_real_dtype(a.dtype, name)
        t = to_tensor(a.astype(np.float64, copy=False))
    if t.ndim < 2:
        raise ValueError(f"{name}: expected shape (..., n_tokens, dim), got {tuple(t.shape)}")
    if t.shape[-2] == 0 or t.shape[-1] == 0:
        raise ValueError(f"{name}: got an empty array of shape {tuple(t.shape)}")
    if not bool(torch.isfinite(t).all()):
        raise ValueError(f"{name}: contains NaN or infinity")
    return t


def _kernel_matrix(kernel, shape, name, ndim):
    """A CSR matrix of precomputed kernel values of the expected ``shape`` (2-D inputs only)."""
    if ndim != 2:
        raise ValueError(f"{name}: a precomputed kernel needs 2-D (n_tokens, dim) inputs, got "
                         f"{ndim}-D ones")
    W = sp.csr_matrix(kernel, dtype=np.float64)
    if W.shape != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)}, got {W.shape}")
    if not np.all(np.isfinite(W.data)) or np.any(W.data < 0):
        raise ValueError(f"{name}: expected finite non-negative kernel values")
    return W


def _check_qkv(Q, K, V, scale):
    """Validate shapes ``Q (..., M, D)``, ``K (..., N, D)``, ``V (..., N, m)`` and the scale."""
    if Q is not None and (Q.shape[:-2] != K.shape[:-2] or Q.shape[-1] != K.shape[-1]):
        raise ValueError(
            f"Q: expected shape (..., M, {K.shape[-1]}) with leading dimensions "
            f"{tuple(K.shape[:-2])} as K {tuple(K.shape)}, got {tuple(Q.shape)}"
        )
    if V.shape[:-1] != K.shape[:-1]:
        raise ValueError(
            f"V: expected one value per key, shape {(*K.shape[:-1], 'm')} as K "
            f"{tuple(K.shape)}, got {tuple(V.shape)}"
        )
    if scale is None:
        return 1.0 / math.sqrt(K.shape[-1])
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not (
        math.isfinite(scale) and scale > 0
    ):
        raise ValueError(f"scale: expected a positive finite number or None, got {scale!r}")
    return float(scale)


def projection_loss(Q, K, V, scale=None, form="consistent", *, kernel=None, kernel_diag=None):
    """Reconstruction (projection) loss ``J_proj`` of one attention layer, with both its terms.

    ``J_proj = (1/M) sum_i (||varphi(q_i)||^2 - ||h_i||^2)`` with ``h_i = softmax(s q_i K^T) V``
    and ``||varphi(q_i)||^2 = exp(s q_i.q_i) / g(q_i)^2``. When ``V`` holds the kernel-PCA values
    of the keys, ``h_i`` is the projection of ``varphi(q_i)`` onto the principal axes and each
    term of the sum is the squared distance from ``varphi(q_i)`` to its projection (``>= 0``).

    Parameters
    ----------
    Q : array-like or torch.Tensor of shape (..., M, D)
        Queries.
    K : array-like or torch.Tensor of shape (..., N, D)
        Keys.
    V : array-like or torch.Tensor of shape (..., N, m)
        Values.
    scale : float, default=None
        Attention scale ``s``; None means ``1 / sqrt(D)``.
    form : {"consistent", "official"}, default="consistent"
        ``"consistent"``: the formula above, with the same scale everywhere; the reported
        ``loss`` is ``mean_j_proj``. ``"official"``: the authors' released code, which leaves the
        scale out of the two exponentials of ``||varphi(q_i)||^2`` (``exp(q.q)`` and
        ``g(q) = sum_j exp(q.k_j)``) and reports ``loss = log(mean_j_proj)``.
    kernel : array-like or scipy.sparse matrix of shape (M, N), default=None
        Kernel values ``k(q_i, k_j)`` of another kernel (2-D inputs only), used instead of
        ``exp(s q_i.k_j)``: ``g(q_i)`` is the row sum, ``h_i = (kernel_i / g(q_i)) V`` and
        ``||varphi(q_i)||^2 = k(q_i, q_i) / g(q_i)^2``. For the invariant kernel pass
        ``KernelPCAAttention(kernel="invariant").kernel_matrix(Q)``. Only ``form="consistent"``.
    kernel_diag : array-like of shape (M,), default=None
        ``k(q_i, q_i)`` for ``kernel``; None means 1 (any ``exp(-d(q, .))`` with
        ``d(q, q) = 0``, the invariant kernel included).

    Returns
    -------
    result : dict
        ``phi_q_sq_norm``, ``h_sq_norm``, ``j_proj``: ndarrays of shape (..., M), per query;
        ``mean_phi_q_sq_norm``, ``mean_h_sq_norm``, ``mean_j_proj``: their means over every
        query (and leading index); ``loss``: the number the form reports (NaN when
        ``form="official"`` and ``mean_j_proj <= 0``); ``form`` and ``scale``.

    Notes
    -----
    Both terms are formed in log space (``exp(s q.q - 2 log g(q))`` with a log-sum-exp ``g``), so
    large logits neither overflow nor lose the ratio. The ``"official"`` form is our reading of
    the released code as described in the project's REFERENCE.md; ``h`` is the layer's attention
    output (with its scale) in both forms. Report both terms: in trained ViTs they can be orders
    of magnitude apart, and then ``J_proj`` mostly tracks ``-||h||^2``.

    Examples
    --------
    >>> import numpy as np
    >>> from invariant_cluster.diagnostics import projection_loss
    >>> rng = np.random.RandomState(0)
    >>> Q, K, V = rng.normal(size=(3, 17, 8))
    >>> sorted(projection_loss(Q, K, V))[:3]
    ['form', 'h_sq_norm', 'j_proj']
    """
    if form not in ("consistent", "official"):
        raise ValueError(f"form: expected 'consistent' or 'official', got {form!r}")
    Q, K, V = _as_float64(Q, "Q"), _as_float64(K, "K"), _as_float64(V, "V")
    scale = _check_qkv(Q, K, V, scale)
    if kernel is not None:
        if form != "consistent":
            raise ValueError("form: a precomputed kernel has no 'official' form, got "
                             f"form={form!r} with kernel given")
        Wq = _kernel_matrix(kernel, (Q.shape[-2], K.shape[-2]), "kernel", Q.ndim)
        g = np.asarray(Wq.sum(axis=1)).ravel()
        if not np.all(g > 0):
            raise ValueError("kernel: every query needs a positive kernel value (a row sums "
                             "to 0)")
        h = torch.as_tensor(np.asarray(sp.diags(1.0 / g) @ Wq @ V.numpy()))
        diag = np.ones_like(g) if kernel_diag is None else np.asarray(kernel_diag, np.float64)
        if diag.shape != g.shape:
            raise ValueError(f"kernel_diag: expected shape {g.shape}, got {diag.shape}")
        phi_sq = torch.as_tensor(diag / g**2)
    else:
        logits = scale * (Q @ K.transpose(-2, -1))
        h = torch.softmax(logits, dim=-1) @ V
        qq = (Q * Q).sum(dim=-1)
        if form == "consistent":
            phi_sq = torch.exp(scale * qq - 2.0 * torch.logsumexp(logits, dim=-1))
        else:
            phi_sq = torch.exp(qq - 2.0 * _log_normalisers(Q, K, 1.0))
    h_sq = (h * h).sum(dim=-1)
    j = phi_sq - h_sq
    mean_j = float(j.mean())
    if form == "consistent":
        loss = mean_j
    else:
        loss = math.log(mean_j) if mean_j > 0 else math.nan
    return {
        "phi_q_sq_norm": phi_sq.numpy(),
        "h_sq_norm": h_sq.numpy(),
        "j_proj": j.numpy(),
        "mean_phi_q_sq_norm": float(phi_sq.mean()),
        "mean_h_sq_norm": float(h_sq.mean()),
        "mean_j_proj": mean_j,
        "loss": loss,
        "form": form,
        "scale": scale,
    }


def _pair_stats(gamma):
    """Mean and std over pairs ``i < j`` of ``|g_i - g_j|`` and of the relative difference.

    ``gamma`` is ``(..., N)``; returns four ``(...)`` tensors. A pair of zeros has relative
    difference 0.
    """
    n = gamma.shape[-1]
    i, j = torch.triu_indices(n, n, offset=1)
    gi, gj = gamma[..., i], gamma[..., j]
    diff = (gi - gj).abs()
    denom = torch.maximum(gi.abs(), gj.abs())
    rel = torch.where(denom > 0, diff / torch.where(denom > 0, denom, 1.0), 0.0)
    return diff.mean(-1), diff.std(-1, correction=0), rel.mean(-1), rel.std(-1, correction=0)


def eigenvector_check(K, V, scale=None, n_random=10, random_state=None, *, kernel=None):
    """Test whether values are kernel-PCA eigenvectors of the keys' Gram matrix ("Eq. 11").

    From the values recover ``a_hat_d = G v_d`` (``G = diag(g(k_j))``). If ``V`` has the kernel
    PCA form ``G^-1 (I - 1_N) A`` then ``gamma = (Kc a_hat_d) / a_hat_d`` (element-wise) is the
    constant vector ``N lambda_d``. For each component this reports the spread of ``gamma`` over
    pairs of entries, next to the same statistic for random vectors of the same norm (without
    that baseline the number means nothing) and to the eigenvalues of ``Kc``.

    Parameters
    ----------
    K : array-like or torch.Tensor of shape (..., N, D)
        Keys (``N >= 2``).
    V : array-like or torch.Tensor of shape (..., N, m)
        Values; column ``d`` is ``v_d``.
    scale : float, default=None
        Attention scale ``s``; None means ``1 / sqrt(D)``.
    n_random : int, default=10
        Random vectors per component for the baseline.
    random_state : None, int or numpy.random.RandomState, default=None
        Seeds the baseline's random vectors (a local generator).
    kernel : array-like or scipy.sparse matrix of shape (N, N), default=None
        Symmetric kernel values ``k(k_i, k_j)`` of another kernel (2-D inputs only), used
        instead of ``exp(s k_i.k_j)``; e.g. ``KernelPCAAttention(kernel="invariant").gram_``.
        A sparse matrix stays sparse (``Kc`` is applied as an operator, and only the ``m``
        leading eigenvalues are computed); the pair statistics still cost ``O(N^2 m)``.

    Returns
    -------
    result : dict of ndarrays, each of shape (..., m)
        ``eigenvalue``: the ``d``-th largest eigenvalue of ``Kc`` (``N lambda_d``, in the units of
        ``gamma``; NaN where ``d >= N``); ``gamma_median``: the median of ``gamma`` (the eigenvalue
        the values imply); ``abs_diff_mean``, ``abs_diff_std``: mean and std over pairs
        ``i < j`` of ``|gamma_i - gamma_j|``; ``rel_diff_mean``, ``rel_diff_std``: the same for
        ``|gamma_i - gamma_j| / max(|gamma_i|, |gamma_j|)``; ``random_abs_diff_mean``,
        ``random_abs_diff_std``, ``random_rel_diff_mean``, ``random_rel_diff_std``: the same
        statistics for random Gaussian vectors of norm ``||a_hat_d||``, averaged over
        ``n_random`` draws.

    Notes
    -----
    ``gamma`` does not change when ``a_hat_d`` is multiplied by a constant, so ``G`` is applied
    as ``exp(log g - max log g)`` (no overflow). An entry of ``a_hat_d`` at zero gives an
    infinite ``gamma_i``, which is what the statistic means there; random values make such
    spikes (entries near zero) common, which is why the relative version is reported too.

    Examples
    --------
    >>> import numpy as np
    >>> from invariant_cluster.diagnostics import eigenvector_check
    >>> rng = np.random.RandomState(0)
    >>> out = eigenvector_check(rng.normal(size=(17, 8)), rng.normal(size=(17, 8)), random_state=0)
    >>> out["abs_diff_mean"].shape
    (8,)
    """
    if isinstance(n_random, bool) or not isinstance(n_random, numbers.Integral) or n_random < 1:
        raise ValueError(f"n_random: expected a positive int, got {n_random!r}")
    K, V = _as_float64(K, "K"), _as_float64(V, "V")
    scale = _check_qkv(None, K, V, scale)
    n, m = K.shape[-2], V.shape[-1]
    if n < 2:
        raise ValueError(f"K: expected at least 2 keys, got shape {tuple(K.shape)}")
    rng = check_random_state(random_state)
    eigenvalue = torch.full((*K.shape[:-2], m), math.nan, dtype=torch.float64)
    if kernel is None:
        gram, log_g = _normalised_gram(K, scale)
        Kc = _centre(gram)
        evals = torch.linalg.eigvalsh(Kc).flip(-1)
        eigenvalue[..., : min(m, n)] = evals[..., : min(m, n)]

        def apply_kc(a):  # (..., m, N) -> a Kc (Kc is symmetric: (Kc a)^T = a^T Kc)
            return a @ Kc
    else:
        Kphi, log_g = _sparse_normalised_gram(_kernel_matrix(kernel, (n, n), "kernel", K.ndim))
        evals, _ = _leading_eigen(Kphi, min(m, n))
        eigenvalue[: min(m, n)] = torch.as_tensor(evals[: min(m, n)].copy())
        log_g = torch.as_tensor(log_g)

        def apply_kc(a):
            return torch.as_tensor(_centred_apply(Kphi, a.T.numpy()).T.copy())
    g = torch.exp(log_g - log_g.amax(dim=-1, keepdim=True))
    a_hat = (g[..., :, None] * V).transpose(-2, -1)  # (..., m, N)
    gamma = apply_kc(a_hat) / a_hat
    stats = _pair_stats(gamma)
    norms = a_hat.norm(dim=-1, keepdim=True)  # (..., m, 1)
    rand_stats = [torch.zeros_like(s) for s in stats]
    for _ in range(int(n_random)):
        r = torch.as_tensor(rng.standard_normal(size=a_hat.shape))
        r = r * norms / r.norm(dim=-1, keepdim=True)
        for acc, s in zip(rand_stats, _pair_stats(apply_kc(r) / r)):
            acc += s / n_random
    names = ("abs_diff_mean", "abs_diff_std", "rel_diff_mean", "rel_diff_std")
    result = {"eigenvalue": eigenvalue.numpy(), "gamma_median": gamma.median(-1).values.numpy()}
    result.update({k: s.numpy() for k, s in zip(names, stats)})
    result.update({f"random_{k}": s.numpy() for k, s in zip(names, rand_stats)})
    return result


def _mha_qkv(module, args, kwargs):
    """Queries, keys and values ``(B, H, N, head_dim)`` that an ``nn.MultiheadAttention`` used."""
    names = ("query", "key", "value")
    query, key, value = (args[i] if len(args) > i else kwargs[n] for i, n in enumerate(names))
    E, H = module.embed_dim, module.num_heads
    if module._qkv_same_embed_dim:
        w_q, w_k, w_v = module.in_proj_weight.chunk(3)
    else:
        w_q, w_k, w_v = module.q_proj_weight, module.k_proj_weight, module.v_proj_weight
    if module.in_proj_bias is not None:
        b_q, b_k, b_v = module.in_proj_bias.chunk(3)
    else:
        b_q = b_k = b_v = None
    batched = query.dim() == 3
    if not batched:
        query, key, value = query.unsqueeze(0), key.unsqueeze(0), value.unsqueeze(0)
    elif not module.batch_first:
        query, key, value = query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1)
    q = torch.nn.functional.linear(query, w_q, b_q)
    k = torch.nn.functional.linear(key, w_k, b_k)
    v = torch.nn.functional.linear(value, w_v, b_v)
    B = q.shape[0]
    if module.bias_k is not None:
        k = torch.cat([k, module.bias_k.reshape(1, 1, E).expand(B, 1, E)], dim=1)
        v = torch.cat([v, module.bias_v.reshape(1, 1, E).expand(B, 1, E)], dim=1)
    if module.add_zero_attn:
        k = torch.cat([k, k.new_zeros(B, 1, E)], dim=1)
        v = torch.cat([v, v.new_zeros(B, 1, E)], dim=1)

    def split(t):
        return t.reshape(B, t.shape[1], H, E // H).transpose(1, 2)

    return split(q), split(k), split(v)


def capture_attention(model, inputs):
    """Run ``model`` once and record, per attention layer and head, the Q, K, V it used.

    Forward hooks (removed afterwards; the model is not edited) on every
    :class:`torch.nn.MultiheadAttention` and on every module with a ``compute_qkv`` method (this
    package's attention modules, or any module following that contract).

    Parameters
    ----------
    model : torch.nn.Module
        Run in its current mode (train or eval) under :func:`torch.no_grad`.
    inputs : torch.Tensor, tuple or dict
        ``model(inputs)``; a tuple is unpacked as positional and a dict as keyword arguments.

    Returns
    -------
    layers : dict
        Module name (as in ``model.named_modules()``; ``name[k]`` for the ``k``-th extra call of a
        module used more than once) to a dict with ``q``, ``k``, ``v``: ndarrays of shape
        ``(B, num_heads, N, head_dim)`` (``k`` and ``v`` have the key length), ``scale``: the
        attention scale ``1 / sqrt(head_dim)``, and ``module``: the class name. In call order.

    Notes
    -----
    For ``nn.MultiheadAttention`` the projections are recomputed from ``in_proj_weight`` /
    ``in_proj_bias`` (or the separate ``q/k/v_proj_weight``) on the inputs the hook receives,
    ``batch_first`` or not; unbatched inputs get ``B = 1``; ``bias_k``/``bias_v`` and
    ``add_zero_attn`` append their extra keys as the layer does. Masks are not applied: the
    arrays are what the layer multiplied before masking. For modules with ``compute_qkv`` the
    hook calls that method on the module's input, which the forward pass itself uses.

    Examples
    --------
    >>> import torch
    >>> from invariant_cluster.diagnostics import capture_attention
    >>> mha = torch.nn.MultiheadAttention(8, 2, batch_first=True)
    >>> x = torch.randn(3, 5, 8)
    >>> out = capture_attention(mha.eval(), (x, x, x))
    >>> out[""]["q"].shape
    (3, 2, 5, 4)
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    records = {}

    def make_hook(name):
        def hook(module, args, kwargs, output):
            if isinstance(module, torch.nn.MultiheadAttention):
                q, k, v = _mha_qkv(module, args, kwargs)
            else:
                x = args[0] if args else next(iter(kwargs.values()))
                q, k, v = module.compute_qkv(x)
            key, extra = name, 0
            while key in records:
                extra += 1
                key = f"{name}[{extra}]"
            records[key] = {
                "q": q.detach().cpu().numpy(),
                "k": k.detach().cpu().numpy(),
                "v": v.detach().cpu().numpy(),
                "scale": 1.0 / math.sqrt(q.shape[-1]),
                "module": type(module).__name__,
            }

        return hook

    handles = []
    try:
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.MultiheadAttention) or callable(
                getattr(module, "compute_qkv", None)
            ):
                handles.append(
                    module.register_forward_hook(make_hook(name), with_kwargs=True)
                )
        with torch.no_grad():
            if isinstance(inputs, dict):
                model(**inputs)
            elif isinstance(inputs, tuple | list):
                model(*inputs)
            else:
                model(inputs)
    finally:
        for h in handles:
            h.remove()
    return records
