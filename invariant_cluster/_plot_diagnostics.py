"""Plots of the kernel-PCA diagnostics (re-exported by :mod:`invariant_cluster.plotting`).

matplotlib is imported inside the functions, so importing this module costs nothing.
"""

from __future__ import annotations

import numpy as np

__all__ = ["plot_projection_loss", "plot_eigenvector_check"]


def _axes(ax):
    if ax is None:
        import matplotlib.pyplot as plt

        _, ax = plt.subplots(figsize=(5, 3.5))
    return ax


def plot_projection_loss(result, ax=None, *, x=None, title=None):
    """Plot the projection loss ``J_proj`` and its two terms.

    Parameters
    ----------
    result : dict or list of dict
        One output of :func:`invariant_cluster.diagnostics.projection_loss` (the per-query terms
        are plotted against the query index, flattened over leading dimensions), or a list of
        them, e.g. one per epoch (their means are plotted against ``x``).
    ax : matplotlib.axes.Axes, default=None
        Where to draw; None makes a new figure.
    x : sequence of float, default=None
        Positions of the list's entries (e.g. epochs); None means ``0, 1, ...``.
    title : str, default=None
        Axes title; None names the form.

    Returns
    -------
    ax : matplotlib.axes.Axes

    Notes
    -----
    The y axis is logarithmic and shows absolute values; hollow markers flag negative values
    (``J_proj`` is negative when the values are not a projection, and ``||h||^2`` then exceeds
    ``||varphi(q)||^2``). For the
    ``"official"`` form the reported ``loss`` is ``log(mean J_proj)``; the plot shows
    ``mean J_proj`` itself so that both forms share units with their terms.

    Examples
    --------
    >>> import numpy as np
    >>> from invariant_cluster.diagnostics import projection_loss
    >>> from invariant_cluster.plotting import plot_projection_loss
    >>> rng = np.random.default_rng(0)
    >>> Q, K, V = (rng.normal(size=(16, 4)) for _ in range(3))
    >>> ax = plot_projection_loss(projection_loss(Q, K, V))
    >>> ax.get_yscale(), len(ax.lines) >= 3  # J_proj and its two terms
    ('log', True)
    """
    ax = _axes(ax)
    if isinstance(result, dict):
        series = {k: np.ravel(result[k]) for k in ("phi_q_sq_norm", "h_sq_norm", "j_proj")}
        xs = np.arange(series["j_proj"].size)
        form = result.get("form", "")
        xlabel = "query"
    else:
        result = list(result)
        if not result:
            raise ValueError("result: expected a projection_loss dict or a non-empty list of them")
        series = {
            k: np.array([r[f"mean_{k}"] for r in result])
            for k in ("phi_q_sq_norm", "h_sq_norm", "j_proj")
        }
        xs = np.arange(len(result)) if x is None else np.asarray(x)
        if xs.shape != (len(result),):
            raise ValueError(f"x: expected {len(result)} positions, got shape {xs.shape}")
        form = result[0].get("form", "")
        xlabel = "step"
    labels = {
        "phi_q_sq_norm": r"$\|\varphi(q)\|^2$",
        "h_sq_norm": r"$\|h\|^2$",
        "j_proj": r"$J_{proj}$",
    }
    styles = {"phi_q_sq_norm": "--", "h_sq_norm": ":", "j_proj": "-"}
    for key, values in series.items():
        (line,) = ax.plot(xs, np.abs(values), styles[key], label=labels[key])
        if xs.size <= 40:  # filled markers where the value is positive, hollow where negative
            pos = values > 0
            ax.plot(xs[pos], values[pos], "o", ms=3.5, color=line.get_color())
            ax.plot(xs[~pos], -values[~pos], "o", ms=3.5, mfc="none", color=line.get_color())
    if np.any(np.abs(np.concatenate(list(series.values()))) > 0):
        ax.set_yscale("log")
    ax.set_ylabel("absolute value (hollow: negative)")
    ax.set_xlabel(xlabel)
    ax.set_title(title if title is not None else f"projection loss ({form})")
    ax.legend(fontsize="small")
    return ax


def plot_eigenvector_check(result, ax=None, *, title=None):
    """Plot the eigenvector check per component against its random baseline.

    Parameters
    ----------
    result : dict
        Output of :func:`invariant_cluster.diagnostics.eigenvector_check`. Arrays with leading
        dimensions (batch, heads) are reduced to their median over them (the statistic is heavy
        tailed: an entry of ``a_hat`` near zero makes one ``gamma_i`` huge).
    ax : matplotlib.axes.Axes, default=None
        Where to draw; None makes a new figure.
    title : str, default=None
        Axes title.

    Returns
    -------
    ax : matplotlib.axes.Axes

    Notes
    -----
    Draws, per component on a logarithmic axis: mean ``|gamma_i - gamma_j|`` with its standard
    deviation as a one-sided (upper) error bar (the learned values), the same for random vectors
    of the same norm (the baseline), and the eigenvalue ``N lambda_d`` for scale. Values far
    below the baseline support the kernel-PCA reading; values near it do not.

    Examples
    --------
    >>> import numpy as np
    >>> from invariant_cluster import KernelPCAAttention
    >>> from invariant_cluster.diagnostics import eigenvector_check
    >>> from invariant_cluster.plotting import plot_eigenvector_check
    >>> K = np.random.default_rng(0).normal(size=(32, 4))
    >>> V = KernelPCAAttention(n_components=3, device="cpu").fit(K).values_  # the KPCA form
    >>> ax = plot_eigenvector_check(eigenvector_check(K, V, random_state=0))
    >>> ax.get_yscale()
    'log'
    """
    ax = _axes(ax)

    def flat(key):
        a = np.asarray(result[key], dtype=float)
        return np.nanmedian(a.reshape(-1, a.shape[-1]), axis=0)

    def upper(key):  # one-sided bars: mean + std stays on a log axis, mean - std often does not
        return np.vstack([np.zeros_like(flat(key)), flat(key)])

    comp = np.arange(np.asarray(result["abs_diff_mean"]).shape[-1])
    ax.errorbar(comp - 0.1, flat("abs_diff_mean"), yerr=upper("abs_diff_std"), fmt="o", ms=3,
                capsize=2, label=r"values: mean $|\gamma_i-\gamma_j|$")
    ax.errorbar(comp + 0.1, flat("random_abs_diff_mean"), yerr=upper("random_abs_diff_std"),
                fmt="s", ms=3, capsize=2, label="random vectors (baseline)")
    ax.plot(comp, np.abs(flat("eigenvalue")), "k_", ms=10, label=r"eigenvalue $N\lambda_d$")
    ax.set_yscale("log")
    ax.set_xlabel("component d")
    ax.set_title(title if title is not None else "eigenvector check")
    ax.legend(fontsize="small")
    return ax
