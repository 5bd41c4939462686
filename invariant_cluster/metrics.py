"""Scores of a clustering against known classes, shared by the benchmarks and the command line.

``clustering_accuracy`` is the accuracy under the best one-to-one matching of clusters to
classes (the Hungarian algorithm), the usual ACC of the clustering literature. Unlike ARI and
NMI it is read as a fraction of correctly grouped samples.
"""

from __future__ import annotations

import numpy as np

__all__ = ["clustering_accuracy", "clustering_scores"]


def _check_labels(y_true, y_pred):
    y_true = np.asarray(y_true)
    y_pred = np.asarray(y_pred)
    for name, y in (("y_true", y_true), ("y_pred", y_pred)):
        if y.ndim != 1:
            raise ValueError(f"{name}: expected a 1-D array of labels, got shape {y.shape}")
        if y.dtype == object or np.iscomplexobj(y):
            raise TypeError(f"{name}: expected integer or string labels, got dtype {y.dtype}")
    if y_true.shape != y_pred.shape:
        raise ValueError(
            f"y_pred: expected {y_true.shape[0]} labels as y_true, got {y_pred.shape[0]}"
        )
    if y_true.size == 0:
        raise ValueError("y_true: expected at least one label, got none")
    return y_true, y_pred


def clustering_accuracy(y_true, y_pred):
    """Accuracy of a clustering under the best one-to-one matching of clusters to classes.

    The contingency table of clusters against classes is matched with the Hungarian algorithm
    (:func:`scipy.optimize.linear_sum_assignment`); samples of a cluster matched to its class
    count as correct. With more clusters than classes the extra clusters count as wrong, and
    vice versa.

    Parameters
    ----------
    y_true : array-like of shape (n_samples,)
        The classes (any integer or string labels).
    y_pred : array-like of shape (n_samples,)
        The cluster labels (any integer or string labels).

    Returns
    -------
    accuracy : float
        In ``[0, 1]``; 1 when the clustering equals the classes up to a renaming.

    Raises
    ------
    ValueError
        If the arrays are not 1-D, are empty or differ in length.

    Examples
    --------
    >>> from invariant_cluster.metrics import clustering_accuracy
    >>> clustering_accuracy([0, 0, 1, 1, 2, 2], [5, 5, 3, 3, 3, 7])
    0.8333333333333334
    """
    from scipy.optimize import linear_sum_assignment

    y_true, y_pred = _check_labels(y_true, y_pred)
    _, t = np.unique(y_true, return_inverse=True)
    _, p = np.unique(y_pred, return_inverse=True)
    table = np.zeros((p.max() + 1, t.max() + 1), dtype=np.int64)
    np.add.at(table, (p, t), 1)
    rows, cols = linear_sum_assignment(table, maximize=True)
    return float(table[rows, cols].sum() / y_true.size)


def clustering_scores(y_true, y_pred):
    """ACC (Hungarian), ARI and NMI of a clustering, as a dict.

    Parameters
    ----------
    y_true : array-like of shape (n_samples,)
    y_pred : array-like of shape (n_samples,)

    Returns
    -------
    scores : dict
        ``{"ACC": float, "ARI": float, "NMI": float}``; NMI with the arithmetic mean, as
        :func:`sklearn.metrics.normalized_mutual_info_score` computes it by default.

    Examples
    --------
    >>> from invariant_cluster.metrics import clustering_scores
    >>> clustering_scores([0, 0, 1, 1], [1, 1, 0, 0])
    {'ACC': 1.0, 'ARI': 1.0, 'NMI': 1.0}
    """
    from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

    y_true, y_pred = _check_labels(y_true, y_pred)
    return {
        "ACC": clustering_accuracy(y_true, y_pred),
        "ARI": float(adjusted_rand_score(y_true, y_pred)),
        "NMI": float(normalized_mutual_info_score(y_true, y_pred)),
    }
