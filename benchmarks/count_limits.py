"""Why ``n_clusters=None`` misses some noisy copy sets by more than one: the aligned means test.

Reads the estimator's rows of ``count_draws_seed*.json`` (``bench_count.py --given``) and takes
every copy set whose count is off by more than one. For each, the true groups' aligned means
(``class_averages(X, labels=y)``, each image aligned onto its group's invariant mean) are
compared pair by pair:

    z_ab = D(mean_a, mean_b) / (s2 * (1 / m_a + 1 / m_b))

``D`` the invariant squared distance between the two means, ``m`` the group sizes and ``s2``
the residual per image, ``sum_i min_tau ||x_i - T_tau mean_{y_i}||^2 / (n - k)``: with one
shape and independent noise the two means differ by their noise alone and ``z`` is about 1;
two shapes add their squared distance over the noise left in the means. ``z_between`` is the
smallest ``z`` over pairs of different shapes, the pair a count would have to tell apart;
``true_separation`` the true groups' single-linkage ratio on the dense invariant distances
(``bench_count.true_separation``: under 1, no partition of the samples' distances finds them).

For reference, the same statistic on noisy copy sets the count gets right: 3 shapes x 12 and
x 40 copies of each kind (``--reference-seed``), fitted with one cluster too many
(``n_clusters=k + 1``); ``z_split`` is the ``z`` of the two clusters that share one shape,
the split a count must refuse. A test of the means could count the missed sets only if their
``z_between`` stood above the reference ``z_split``.

    python benchmarks/count_limits.py
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, environment, print_table, write_json  # noqa: E402
from bench_count import copy_set, dense_distances, search_params, true_separation  # noqa: E402

from invariant_cluster import InvariantAttentionClusterer  # noqa: E402
from invariant_cluster.alignment import invariant_distances  # noqa: E402
from invariant_cluster.barycenters import class_averages  # noqa: E402


def means_z(X, labels, search):
    """``(Z, s2)``: the ``z`` of every pair of groups of ``labels`` and the residual per image
    (module docstring)."""
    labels = np.unique(labels, return_inverse=True)[1]
    n, k = len(X), int(labels.max()) + 1
    means = class_averages(X, labels=labels, **search)
    residual = np.asarray(invariant_distances(X, means, **search), dtype=np.float64)
    sizes = np.bincount(labels, minlength=k)
    s2 = float(residual[np.arange(n), labels].sum() / max(n - k, 1))
    D = np.asarray(invariant_distances(means, **search), dtype=np.float64)
    D = np.minimum(D, D.T)
    return D / (s2 * (1.0 / sizes[:, None] + 1.0 / sizes[None])), s2


def pairs(Z, shape_of):
    """``z`` of the pairs of groups of the same shape and of different shapes (sorted)."""
    i, j = np.triu_indices(len(Z), 1)
    same = shape_of[i] == shape_of[j]
    return np.sort(Z[i, j][same]), np.sort(Z[i, j][~same])


def missed_rows(seeds):
    rows = []
    for seed in seeds:
        path = RESULTS / f"count_draws_seed{seed}.json"
        if not path.is_file():
            continue
        for r in json.loads(path.read_text())["rows"]:
            if (r["method"] == "estimator" and r.get("count") is not None
                    and abs(r["count"] - r["k"]) > 1):
                rows.append(r)
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", nargs="+", type=int, default=list(range(7)))
    p.add_argument("--reference-seed", type=int, default=0)
    p.add_argument("--out", default=str(RESULTS / "count_limits.json"))
    args = p.parse_args(argv)
    command = ["python", *sys.argv] if argv is None else ["python", sys.argv[0], *argv]
    result = {"benchmark": "count_limits", "env": environment(), "command": " ".join(command),
              "args": vars(args), "missed": [], "reference": []}
    warnings.simplefilter("ignore")

    for r in missed_rows(args.seeds):
        X, y = copy_set(r["kind"], r["k"], r["copies"], r["noise"], r["seed"])
        search = search_params(r["kind"])
        Z, s2 = means_z(X, y, search)
        _, between = pairs(Z, np.arange(r["k"]))
        result["missed"].append({
            "set": r["set"], "seed": r["seed"], "k": r["k"], "count": r["count"],
            "count_rule": r.get("count_rule"), "ari_given_k": r.get("ari_given_k"),
            "closest_over_noise": r.get("closest_over_noise"),
            "true_separation": true_separation(dense_distances(X, search), y),
            "residual_per_image": s2,
            "z_between": float(between[0]), "z_between_3": between[:3].round(3).tolist()})

    k, seed = 3, args.reference_seed
    for kind in ("digits8", "mnist_rot", "mnist_shift"):
        for c in (12, 40):
            X, y = copy_set(kind, k, c, 0.1, seed)
            search = search_params(kind)
            fit = InvariantAttentionClusterer(n_clusters=k + 1, random_state=seed,
                                              **search).fit(X.reshape(len(X), -1))
            labels = np.unique(fit.labels_, return_inverse=True)[1]
            shape_of = np.array([np.bincount(y[labels == g]).argmax()
                                 for g in range(labels.max() + 1)])
            Z, s2 = means_z(X, labels, search)
            split, between = pairs(Z, shape_of)
            Zt, _ = means_z(X, y, search)
            _, true_between = pairs(Zt, np.arange(k))
            result["reference"].append({
                "set": f"{kind} k={k} c={c} s=0.1", "seed": seed, "k": k,
                "clusters": int(labels.max()) + 1, "residual_per_image": s2,
                "z_split": split.round(3).tolist(),
                "z_between_fit": float(between[0]) if between.size else None,
                "z_between": float(true_between[0])})

    write_json(result, Path(args.out))
    print_table(result["missed"], ["set", "seed", "count", "closest_over_noise",
                                   "true_separation", "ari_given_k", "z_between"])
    print()
    print_table(result["reference"], ["set", "clusters", "z_split", "z_between"])
    return result


if __name__ == "__main__":
    main()
