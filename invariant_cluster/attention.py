"""Attention modules read as kernel PCA: softmax, symmetric and RPC (Principal Attention Pursuit).

Convention
----------
Every module of this file takes tokens ``x`` of shape ``(B, N, C)`` (batch, tokens, embedding
width ``C = dim``) and splits the width into ``num_heads`` heads of ``head_dim = C // num_heads``.
Each has a method ``compute_qkv(x) -> (q, k, v)``, every tensor of shape
``(B, num_heads, N, head_dim)``, and its ``forward`` uses exactly that method, so a forward hook
that calls it (as :func:`invariant_cluster.diagnostics.capture_attention` does) recovers the
queries, keys and values the layer used. The attention scale is ``s = 1 / sqrt(head_dim)``.

- :class:`SoftmaxAttention`: ``softmax(s q k^T) v`` with separate query and key projections.
- :class:`SymmetricAttention`: queries equal keys (one shared projection), as in SymViT.
- :class:`RPCAttention`: symmetric attention whose output is computed by
  :func:`principal_attention_pursuit` (RPC-Attention).
- :class:`VisionTransformer`: a small pre-norm ViT built from these modules.
"""

from __future__ import annotations

import math
import numbers

import torch
from torch import nn
from torch.nn import functional as F

__all__ = [
    "principal_attention_pursuit",
    "SoftmaxAttention",
    "SymmetricAttention",
    "RPCAttention",
    "VisionTransformer",
]


def _check_positive_int(value, name):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name}: expected a positive int, got {value!r}")
    if value < 1:
        raise ValueError(f"{name}: expected a positive int, got {value!r}")
    return int(value)


def _check_positive_real(value, name, allow_inf=False):
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}: expected a positive real number, got {value!r}")
    if not (math.isfinite(value) or (allow_inf and value == math.inf)) or value <= 0:
        raise ValueError(f"{name}: expected a positive real number, got {value!r}")
    return float(value)


def _shrink(x: torch.Tensor, threshold: torch.Tensor) -> torch.Tensor:
    """Soft thresholding ``sign(x) max(|x| - threshold, 0)``, element-wise."""
    return torch.sign(x) * torch.clamp(x.abs() - threshold, min=0)


def principal_attention_pursuit(
    K,
    V,
    n_iter=4,
    lam=4.0,
    mu=None,
    scale=None,
    *,
    embed_dim=None,
    return_sparse=False,
):
    """Principal Attention Pursuit (PAP): the output of RPC-Attention on keys ``K``, values ``V``.

    Parameters
    ----------
    K : torch.Tensor of shape (..., N, D)
        Keys (which are also the queries: RPC-Attention is a symmetric attention).
    V : torch.Tensor of shape (..., N, D)
        Values. They must have the keys' width ``D``, because the low-rank estimate ``L`` (an
        attention output, in the value space) is subtracted from the keys.
    n_iter : int, default=4
        Number of PAP iterations (the authors use 4 in the first layer, or 2 in all layers).
    lam : float, default=4.0
        Sparsity weight; the soft threshold is ``lam * mu``. ``math.inf`` disables shrinkage.
    mu : float or torch.Tensor broadcastable to (..., 1, 1), default=None
        Penalty parameter. None means ``mu = N C / (4 ||K||_1)`` per leading index (per head),
        ``||K||_1`` the sum of absolute values of the ``(N, D)`` key matrix.
    scale : float, default=None
        Attention scale ``s``; None means ``1 / sqrt(D)``.
    embed_dim : int, default=None
        The width ``C`` in the default ``mu``: the full embedding width of the layer (all heads
        together), as in the released code. None means ``D`` (one head on its own).
    return_sparse : bool, default=False
        Also return the sparse part ``S`` of the last iteration.

    Returns
    -------
    L : torch.Tensor of shape (..., N, D)
        The attention output.
    S : torch.Tensor of shape (..., N, D)
        Only when ``return_sparse``: the sparse part removed from the keys.

    Notes
    -----
    The iteration is the authors' released algorithm, as written in the project's REFERENCE.md::

        L = 0, Y = 0
        repeat n_iter times:
            S = shrink(K - L + Y / mu, lam * mu)
            Kh = K - S - Y / mu
            L = softmax(s Kh Kh^T) V
            Y = Y + mu (K - L - S)

    It differs from textbook ADMM for Principal Component Pursuit in three ways that we keep on
    purpose, to match the released code: the threshold is ``lam * mu`` (not ``lam / mu``), the
    low-rank step reads ``K - S - Y / mu`` (not ``+ Y / mu``), and the singular value
    thresholding is replaced by one symmetric softmax attention. Consequences, checked by the
    tests: one iteration is softmax attention over the keys clipped to ``+-lam * mu``; with
    ``lam = inf`` and one iteration it is plain symmetric softmax attention, but with more
    iterations it is not (the second iteration attends with ``Kh = L``). The softmax subtracts the
    row maximum (``torch.softmax``), so large logits do not overflow. ``mu`` is differentiated
    through, as in the released code. New tensors follow ``K``'s device and dtype.

    Examples
    --------
    >>> import torch
    >>> from invariant_cluster.attention import principal_attention_pursuit
    >>> K = torch.randn(2, 4, 17, 8)
    >>> principal_attention_pursuit(K, K, n_iter=2).shape
    torch.Size([2, 4, 17, 8])
    """
    if not isinstance(K, torch.Tensor) or not isinstance(V, torch.Tensor):
        raise TypeError(
            f"K, V: expected torch.Tensor, got {type(K).__name__} and {type(V).__name__}"
        )
    if K.ndim < 2:
        raise ValueError(f"K: expected shape (..., N, D), got {tuple(K.shape)}")
    if V.shape != K.shape:
        raise ValueError(
            f"V: expected the keys' shape {tuple(K.shape)} (..., N, D), got {tuple(V.shape)}"
        )
    if not K.is_floating_point() or not V.is_floating_point():
        raise TypeError(f"K, V: expected floating point tensors, got {K.dtype} and {V.dtype}")
    n_iter = _check_positive_int(n_iter, "n_iter")
    lam = _check_positive_real(lam, "lam", allow_inf=True)
    n, d = K.shape[-2], K.shape[-1]
    if scale is None:
        scale = 1.0 / math.sqrt(d)
    else:
        scale = _check_positive_real(scale, "scale")
    if mu is None:
        width = d if embed_dim is None else _check_positive_int(embed_dim, "embed_dim")
        l1 = K.abs().sum(dim=(-2, -1), keepdim=True)
        # An all-zero key matrix has nothing to separate; any finite mu gives S = 0 then (an
        # infinite one, from dividing by ~0, turns the dual update inf * 0 into NaN).
        mu = torch.where(l1 > 0, n * width / (4.0 * l1), torch.ones_like(l1))
        mu = mu.clamp(max=torch.finfo(K.dtype).max / (4.0 * n * width))
    elif not isinstance(mu, torch.Tensor):
        mu = _check_positive_real(mu, "mu")
    L = torch.zeros_like(K)
    Y = torch.zeros_like(K)
    S = torch.zeros_like(K)
    for _ in range(n_iter):
        S = _shrink(K - L + Y / mu, lam * mu)
        Kh = K - S - Y / mu
        attn = torch.softmax(scale * (Kh @ Kh.transpose(-2, -1)), dim=-1)
        L = attn @ V
        Y = Y + mu * (K - L - S)
    if return_sparse:
        return L, S
    return L


class _MultiHeadBase(nn.Module):
    """Shared bookkeeping: width, heads, scale, output projection, head merging; softmax forward.

    Subclasses define ``compute_qkv``; ``forward`` uses it.
    """

    def __init__(self, dim, num_heads):
        super().__init__()
        dim = _check_positive_int(dim, "dim")
        num_heads = _check_positive_int(num_heads, "num_heads")
        if dim % num_heads:
            raise ValueError(f"num_heads: must divide dim={dim}, got {num_heads}")
        self.dim = dim
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim**-0.5
        self.proj = nn.Linear(dim, dim)

    def _check_input(self, x):
        if not isinstance(x, torch.Tensor) or x.ndim != 3 or x.shape[-1] != self.dim:
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"x: expected shape (B, N, {self.dim}), got {shape}")

    def _split(self, t):
        b, n, _ = t.shape
        return t.reshape(b, n, self.num_heads, self.head_dim).transpose(1, 2)

    def _merge(self, t):
        b, _, n, _ = t.shape
        return self.proj(t.transpose(1, 2).reshape(b, n, self.dim))

    def forward(self, x):
        """``softmax(s q k^T) v`` of ``compute_qkv(x)``, heads merged and projected."""
        q, k, v = self.compute_qkv(x)
        return self._merge(F.scaled_dot_product_attention(q, k, v, scale=self.scale))

    def extra_repr(self):
        return f"dim={self.dim}, num_heads={self.num_heads}"


class SoftmaxAttention(_MultiHeadBase):
    """Multi-head softmax self-attention ``softmax(s q k^T) v`` (the standard ViT layer).

    Parameters
    ----------
    dim : int
        Embedding width ``C``.
    num_heads : int
        Number of heads; must divide ``dim``.

    Notes
    -----
    ``forward(x)`` maps ``(B, N, C)`` to ``(B, N, C)`` and uses :meth:`compute_qkv`.

    Examples
    --------
    >>> import torch
    >>> from invariant_cluster.attention import SoftmaxAttention
    >>> layer = SoftmaxAttention(dim=16, num_heads=4)
    >>> x = torch.randn(2, 10, 16, generator=torch.Generator().manual_seed(0))
    >>> layer(x).shape
    torch.Size([2, 10, 16])
    >>> [t.shape for t in layer.compute_qkv(x)][0]  # (B, num_heads, N, head_dim)
    torch.Size([2, 4, 10, 4])
    """

    def __init__(self, dim, num_heads):
        super().__init__(dim, num_heads)
        self.qkv = nn.Linear(self.dim, 3 * self.dim)

    def compute_qkv(self, x):
        """Queries, keys and values ``(B, num_heads, N, head_dim)`` of tokens ``(B, N, C)``."""
        self._check_input(x)
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return self._split(q), self._split(k), self._split(v)


class SymmetricAttention(_MultiHeadBase):
    """Multi-head symmetric softmax attention: queries equal keys (SymViT).

    Parameters
    ----------
    dim : int
        Embedding width ``C``.
    num_heads : int
        Number of heads; must divide ``dim``.

    Notes
    -----
    One projection ``qk`` gives both queries and keys, so the attention logits ``s k_i . k_j``
    are symmetric; this is the setting in which RPC-Attention is defined. ``forward(x)`` maps
    ``(B, N, C)`` to ``(B, N, C)`` and uses :meth:`compute_qkv`.

    Examples
    --------
    >>> import torch
    >>> from invariant_cluster.attention import SymmetricAttention
    >>> layer = SymmetricAttention(dim=16, num_heads=4)
    >>> x = torch.randn(2, 10, 16, generator=torch.Generator().manual_seed(0))
    >>> q, k, v = layer.compute_qkv(x)
    >>> q is k, layer(x).shape
    (True, torch.Size([2, 10, 16]))
    """

    def __init__(self, dim, num_heads):
        super().__init__(dim, num_heads)
        self.qk = nn.Linear(self.dim, self.dim)
        self.v = nn.Linear(self.dim, self.dim)

    def compute_qkv(self, x):
        """Queries (= keys), keys and values, each ``(B, num_heads, N, head_dim)``."""
        self._check_input(x)
        k = self._split(self.qk(x))
        return k, k, self._split(self.v(x))


class RPCAttention(SymmetricAttention):
    """RPC-Attention: symmetric attention computed by Principal Attention Pursuit.

    Parameters
    ----------
    dim : int
        Embedding width ``C``.
    num_heads : int
        Number of heads; must divide ``dim``.
    n_iter : int, default=4
        PAP iterations.
    lam : float, default=4.0
        PAP sparsity weight.

    Notes
    -----
    Same parameters as :class:`SymmetricAttention` (so the two can share an initialisation);
    per head the output is ``principal_attention_pursuit(k, v, n_iter, lam, embed_dim=dim)``,
    i.e. ``mu = N C / (4 ||k||_1)`` with ``C`` the full width, as in the released code.
    :meth:`compute_qkv` returns the keys before PAP cleans them.

    Examples
    --------
    With one iteration and no shrinkage (``lam=inf``) it is the symmetric attention it extends:

    >>> import math
    >>> import torch
    >>> from invariant_cluster.attention import RPCAttention, SymmetricAttention
    >>> sym = SymmetricAttention(dim=16, num_heads=4)
    >>> rpc = RPCAttention(dim=16, num_heads=4, n_iter=1, lam=math.inf)
    >>> _ = rpc.load_state_dict(sym.state_dict())  # the same weights
    >>> x = torch.randn(2, 10, 16, generator=torch.Generator().manual_seed(0))
    >>> bool(torch.allclose(rpc(x), sym(x), atol=1e-6))
    True
    >>> RPCAttention(dim=16, num_heads=4)(x).shape  # the default: 4 PAP iterations
    torch.Size([2, 10, 16])
    """

    def __init__(self, dim, num_heads, n_iter=4, lam=4.0):
        super().__init__(dim, num_heads)
        self.n_iter = _check_positive_int(n_iter, "n_iter")
        self.lam = _check_positive_real(lam, "lam", allow_inf=True)

    def forward(self, x):
        _, k, v = self.compute_qkv(x)
        out = principal_attention_pursuit(
            k, v, n_iter=self.n_iter, lam=self.lam, scale=self.scale, embed_dim=self.dim
        )
        return self._merge(out)

    def extra_repr(self):
        return f"{super().extra_repr()}, n_iter={self.n_iter}, lam={self.lam}"


class _Block(nn.Module):
    """Pre-norm transformer block: ``x + attn(LN(x))`` then ``x + MLP(LN(x))``."""

    def __init__(self, attn, dim, mlp_ratio):
        super().__init__()
        hidden = max(1, int(round(dim * mlp_ratio)))
        self.norm1 = nn.LayerNorm(dim)
        self.attn = attn
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class VisionTransformer(nn.Module):
    """A small Vision Transformer (patch embedding, class token, pre-norm blocks, linear head).

    Parameters
    ----------
    image_size : int or tuple of int
        ``H`` or ``(H, W)``; each must be divisible by ``patch_size``.
    patch_size : int
        Side of the square patches; the model sees ``(H / p) (W / p) + 1`` tokens.
    dim : int
        Embedding width.
    depth : int
        Number of blocks.
    num_heads : int
        Heads per attention layer.
    num_classes : int
        Output logits.
    attention : {"softmax", "symmetric", "rpc"}, default="softmax"
        ``"rpc"`` is RPC-SymViT: :class:`RPCAttention` in the layers listed in ``rpc_layers`` and
        :class:`SymmetricAttention` in the others.
    rpc_layers : tuple of int, default=(0,)
        Blocks that use RPC-Attention when ``attention="rpc"`` (0 is the first).
    in_channels : int, default=1
        Image channels.
    mlp_ratio : float, default=2.0
        Hidden width of the MLPs relative to ``dim``.
    rpc_n_iter, rpc_lam : int, float, default=4, 4.0
        PAP settings of the RPC layers.
    random_state : None, int or numpy.random.RandomState, default=None
        Seeds a local :class:`torch.Generator` for the initialisation (never the global seed).
        Two models with the same ``random_state`` and the same parameter shapes start from the
        same weights, e.g. a symmetric model and its RPC twin.

    Notes
    -----
    ``forward(images)`` takes ``(B, C, H, W)`` (or ``(B, H, W)``) and returns logits
    ``(B, num_classes)`` read from the class token. Initialisation: truncated normal with
    standard deviation 0.02 for linear and patch weights, positional embedding and class token;
    zero biases; LayerNorm at identity (the usual ViT choice).

    Examples
    --------
    >>> import torch
    >>> from invariant_cluster.attention import VisionTransformer
    >>> model = VisionTransformer(28, 7, dim=32, depth=2, num_heads=4, num_classes=10,
    ...                           attention="rpc", random_state=0)  # RPC-SymViT
    >>> model(torch.zeros(3, 1, 28, 28)).shape
    torch.Size([3, 10])
    >>> [type(block.attn).__name__ for block in model.blocks]
    ['RPCAttention', 'SymmetricAttention']
    """

    def __init__(
        self,
        image_size,
        patch_size,
        dim,
        depth,
        num_heads,
        num_classes,
        attention="softmax",
        rpc_layers=(0,),
        *,
        in_channels=1,
        mlp_ratio=2.0,
        rpc_n_iter=4,
        rpc_lam=4.0,
        random_state=None,
    ):
        super().__init__()
        if isinstance(image_size, numbers.Integral):
            image_size = (image_size, image_size)
        image_size = tuple(_check_positive_int(s, "image_size") for s in image_size)
        if len(image_size) != 2:
            raise ValueError(f"image_size: expected an int or (H, W), got {image_size!r}")
        patch_size = _check_positive_int(patch_size, "patch_size")
        if image_size[0] % patch_size or image_size[1] % patch_size:
            raise ValueError(
                f"patch_size: must divide image_size={image_size}, got {patch_size}"
            )
        depth = _check_positive_int(depth, "depth")
        num_classes = _check_positive_int(num_classes, "num_classes")
        in_channels = _check_positive_int(in_channels, "in_channels")
        if attention not in ("softmax", "symmetric", "rpc"):
            raise ValueError(
                f"attention: expected 'softmax', 'symmetric' or 'rpc', got {attention!r}"
            )
        rpc_layers = tuple(rpc_layers)
        if attention == "rpc" and not all(
            isinstance(i, numbers.Integral) and 0 <= i < depth for i in rpc_layers
        ):
            raise ValueError(
                f"rpc_layers: expected block indices in [0, {depth}), got {rpc_layers}"
            )
        self.image_size = image_size
        self.patch_size = patch_size
        self.in_channels = in_channels
        self.attention = attention
        self.rpc_layers = rpc_layers if attention == "rpc" else ()
        n_tokens = (image_size[0] // patch_size) * (image_size[1] // patch_size) + 1
        # torch's layers draw their default initialisation from the global generator; fork it so
        # that building a model leaves the global state as it was (reset_parameters then
        # overwrites every weight from a local generator).
        with torch.random.fork_rng(devices=[]):
            self.patch_embed = nn.Conv2d(in_channels, dim, patch_size, stride=patch_size)
            self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
            self.pos_embed = nn.Parameter(torch.zeros(1, n_tokens, dim))
            blocks = []
            for i in range(depth):
                if attention == "softmax":
                    attn = SoftmaxAttention(dim, num_heads)
                elif i in self.rpc_layers:
                    attn = RPCAttention(dim, num_heads, n_iter=rpc_n_iter, lam=rpc_lam)
                else:
                    attn = SymmetricAttention(dim, num_heads)
                blocks.append(_Block(attn, dim, mlp_ratio))
            self.blocks = nn.ModuleList(blocks)
            self.norm = nn.LayerNorm(dim)
            self.head = nn.Linear(dim, num_classes)
        self.reset_parameters(random_state)

    @torch.no_grad()
    def reset_parameters(self, random_state=None):
        """Re-initialise every weight from a local generator seeded by ``random_state``."""
        from ._utils import torch_generator

        gen = torch_generator(random_state)
        for module in self.modules():
            if isinstance(module, nn.Linear | nn.Conv2d):
                nn.init.trunc_normal_(module.weight, std=0.02, a=-0.04, b=0.04, generator=gen)
                nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
        for p in (self.cls_token, self.pos_embed):
            nn.init.trunc_normal_(p, std=0.02, a=-0.04, b=0.04, generator=gen)

    def forward(self, images):
        if images.ndim == 3:
            images = images.unsqueeze(1)
        expected = (self.in_channels, *self.image_size)
        if images.ndim != 4 or tuple(images.shape[1:]) != expected:
            raise ValueError(
                f"images: expected shape (B, {', '.join(map(str, expected))}), "
                f"got {tuple(images.shape)}"
            )
        x = self.patch_embed(images).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x[:, 0]))
