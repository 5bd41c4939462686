"""
Kernel-PCA features for a linear classifier
===========================================

Pixels, PCA, KernelPCA(rbf) and KernelPCAAttention as the features of a logistic regression.

Data: MNIST test digits (the 10,000 of the test split), a random ``--n-train`` / ``--n-test``
split (seed ``--seed``), rotated uniformly within +-45 degrees (``rotated45``) or as they are
(``unrotated``). Each feature map is followed by ``LogisticRegression(max_iter=2000)`` fitted on
the training images; the table gives the test accuracy and the seconds of fit + predict.

Feature maps (``--n-components``, 50 by default, for every reduction):

- ``pixels``: the 784 pixels in [0, 1];
- ``PCA``: ``PCA(50)``;
- ``KernelPCA(rbf)``: scikit-learn's ``KernelPCA(50, kernel="rbf", eigen_solver="arpack")``
  (``gamma = 1 / 784``);
- ``KernelPCAAttention``: this library's softmax-kernel PCA at its defaults (``scale="auto"``,
  ``whiten=True``);
- ``KernelPCAAttention(invariant)``: ``kernel="invariant"`` with a rotation grid of
  ``--n-rotations`` angles within ``+-max-rotation`` degrees (24 within +-60 by default: a user
  who knows the data are rotated by up to 45 degrees, plus slant), ``n_neighbors=15``.

Also the pipeline of the issue on scikit-learn's digits (``--digits``, always run):
``StandardScaler -> step(32) -> LogisticRegression``, 3-fold cross-validation, for
``KernelPCA(rbf)`` and ``KernelPCAAttention`` at its defaults, without whitening, and with the
attention convention's scale ``1 / sqrt(D)``.

``--eigencheck`` asks whether the values invariant attention averages are kernel-PCA
eigenvectors of the invariant Gram matrix (Eq. 11), next to random vectors and the estimator's
own values, and reports the projection loss of the invariant kernel on the test images.

``--sweep`` fits the invariant kernel for a few bandwidth factors and neighbour counts on the
rotated data (the measurement behind the default bandwidth).

    python examples/reproductions/kpca_features.py                   # 8,000 / 2,000
    python examples/reproductions/kpca_features.py --n-train 2000 --n-test 1000 --out /tmp
    python examples/reproductions/kpca_features.py --quick --no-plot # smoke run

The full run takes longer than a build of this site, so the gallery shows this script
without running it.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

# the benchmarks' runner: the machine record and the JSON
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from _common import (  # noqa: E402
    environment,
    load_mnist_test,
    print_table,
    table,
    write_json,
)

VARIANTS = {"rotated45": 45.0, "unrotated": 0.0}
METHODS = ("pixels", "PCA", "KernelPCA(rbf)", "KernelPCAAttention",
           "KernelPCAAttention(invariant)")


def make_split(images, labels, variant, n_train, n_test, seed):
    from invariant_cluster.datasets import make_transformed

    rng = np.random.default_rng(seed)
    sel = rng.choice(len(images), n_train + n_test, replace=False)
    X, y = images[sel].astype(np.float32), labels[sel]
    if VARIANTS[variant]:
        X, _ = make_transformed(X, max_rotation=VARIANTS[variant], random_state=seed)
    X = X.reshape(len(X), -1)
    return X[:n_train], y[:n_train], X[n_train:], y[n_train:]


def make_step(name, args):
    from sklearn.decomposition import PCA, KernelPCA

    from invariant_cluster import KernelPCAAttention

    m = args.n_components
    if name == "pixels":
        return None
    if name == "PCA":
        return PCA(m, random_state=0)
    if name == "KernelPCA(rbf)":
        return KernelPCA(m, kernel="rbf", eigen_solver="arpack", random_state=0)
    if name == "KernelPCAAttention":
        return KernelPCAAttention(m)
    return KernelPCAAttention(m, kernel="invariant", max_rotation=args.max_rotation,
                              n_rotations=args.n_rotations, n_neighbors=args.n_neighbors)


def classify(step, Xtr, ytr, Xte, yte):
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline

    pipe = make_pipeline(*([step] if step is not None else []),
                         LogisticRegression(max_iter=2000))
    t0 = time.perf_counter()
    pipe.fit(Xtr, ytr)
    acc = float((pipe.predict(Xte) == yte).mean())
    return acc, time.perf_counter() - t0


def run_digits():
    from sklearn.datasets import load_digits
    from sklearn.decomposition import KernelPCA
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import cross_val_score
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from invariant_cluster import KernelPCAAttention

    X, y = load_digits(return_X_y=True)
    steps = {
        "KernelPCA(32, rbf)": KernelPCA(32, kernel="rbf"),
        "KernelPCAAttention(32) (defaults: scale='auto', whiten=True)": KernelPCAAttention(32),
        "KernelPCAAttention(32, whiten=False)": KernelPCAAttention(32, whiten=False),
        "KernelPCAAttention(32, scale='attention')": KernelPCAAttention(32, scale="attention"),
        "KernelPCAAttention(32, scale='attention', whiten=False) (the old default)":
            KernelPCAAttention(32, scale="attention", whiten=False),
    }
    rows = []
    for name, step in steps.items():
        pipe = make_pipeline(StandardScaler(), step, LogisticRegression(max_iter=2000))
        t0 = time.perf_counter()
        folds = cross_val_score(pipe, X, y, cv=3)
        rows.append({"pipeline": f"StandardScaler -> {name} -> LogisticRegression",
                     "cv3_accuracy": float(folds.mean()), "folds": [float(f) for f in folds],
                     "seconds": time.perf_counter() - t0})
    return rows


def run_sweep(args, images, labels):
    import invariant_cluster.decomposition as dec

    Xtr, ytr, Xte, yte = make_split(images, labels, "rotated45", args.n_train, args.n_test,
                                    args.seed)
    rows = []
    default = dec._BANDWIDTH_FACTOR
    try:
        for k in (10, 15, 30):
            for factor in (0.5, 1.0, 2.0, 4.0, 8.0):
                dec._BANDWIDTH_FACTOR = factor
                args.n_neighbors = k
                acc, sec = classify(make_step("KernelPCAAttention(invariant)", args),
                                    Xtr, ytr, Xte, yte)
                rows.append({"n_neighbors": k, "bandwidth_factor": factor,
                             "accuracy": acc, "seconds": sec})
                print(rows[-1], flush=True)
    finally:
        dec._BANDWIDTH_FACTOR = default
    return rows


def run_eigencheck(args, images, labels):
    """Eq. 11 and J_proj for the invariant kernel: which values are kernel-PCA eigenvectors?

    Values tested against the invariant Gram matrix of the training keys: the estimator's own
    ``values_`` (eigenvectors by construction: the check's floor), the values invariant
    attention averages (the images, as their coordinates on the 10 leading principal
    components, which have no zero entries), and random vectors (the check's own baseline).
    """
    from sklearn.decomposition import PCA

    from invariant_cluster import KernelPCAAttention
    from invariant_cluster.diagnostics import eigenvector_check, projection_loss

    Xtr, _, Xte, _ = make_split(images, labels, "rotated45", args.n_train, args.n_test,
                                args.seed)
    est = KernelPCAAttention(args.n_components, kernel="invariant", whiten=False,
                             max_rotation=args.max_rotation, n_rotations=args.n_rotations,
                             n_neighbors=args.n_neighbors).fit(Xtr)
    pixels = PCA(10, random_state=0).fit_transform(Xtr)
    values = {"kernel-PCA values_ (first 10)": est.values_[:, :10],
              "images (10 PCA coordinates)": pixels,
              "random": np.random.default_rng(0).standard_normal((len(Xtr), 10))}
    checks = []
    for name, V in values.items():
        r = eigenvector_check(est.keys_, V, kernel=est.gram_, n_random=3, random_state=0)
        checks.append({"values": name,
                       "abs_diff_mean": float(np.mean(r["abs_diff_mean"])),
                       "random_abs_diff_mean": float(np.mean(r["random_abs_diff_mean"])),
                       "ratio_to_random": float(np.mean(r["abs_diff_mean"]
                                                        / r["random_abs_diff_mean"])),
                       "rel_diff_mean": float(np.mean(r["rel_diff_mean"])),
                       "random_rel_diff_mean": float(np.mean(r["random_rel_diff_mean"]))})
        print(checks[-1], flush=True)
    losses = []
    for m in (2, 10, args.n_components):
        sub = KernelPCAAttention(m, kernel="invariant", whiten=False,
                                 max_rotation=args.max_rotation, n_rotations=args.n_rotations,
                                 n_neighbors=args.n_neighbors).fit(Xtr)
        out = projection_loss(Xte, sub.keys_, sub.values_, kernel=sub.kernel_matrix(Xte))
        losses.append({"n_components": m, "mean_j_proj": out["mean_j_proj"],
                       "mean_phi_q_sq_norm": out["mean_phi_q_sq_norm"],
                       "mean_h_sq_norm": out["mean_h_sq_norm"],
                       "fraction_negative_j": float(np.mean(out["j_proj"] < 0))})
        print(losses[-1], flush=True)
    w = np.linalg.eigvalsh(est.gram_.toarray()) if len(Xtr) <= 4000 else None
    gram = {"n": len(Xtr), "nnz": int(est.gram_.nnz), "bandwidth": est.bandwidth_,
            "min_eigenvalue": None if w is None else float(w[0]),
            "fraction_negative_eigenvalues": None if w is None else float(np.mean(w < 0))}
    return checks, losses, gram


def table_rows(result):
    """The benchmarks page's tables (rows of data, method, metric, value, machine, date): the
    test accuracy per feature map and data, then the digits' cross-validated pipelines."""
    rows = result.get("rows", [])
    sizes = ", ".join(dict.fromkeys(f"{r['data']}: {r['n_train']:,} train / {r['n_test']:,} test"
                                    for r in rows))
    feats = (f"Test accuracy of `LogisticRegression` on each feature map (seconds of fit + "
             f"predict in brackets); {sizes}.")
    return (table(result, rows, lambda r: feats, lambda r: r["features"], {
        v: (lambda r, v=v: f"{r['accuracy']:.3f} ({r['seconds']:.0f} s)" if r["data"] == v
            else None) for v in dict.fromkeys(r["data"] for r in rows)})
            + table(result, result.get("digits_cv", []),
                    lambda r: "scikit-learn digits, 3-fold cross-validation",
                    lambda r: r["pipeline"], {"accuracy": "cv3_accuracy"}))


def eigencheck_rows(result):
    """The table of ``--eigencheck``: each kind of values against random vectors."""
    rows = result.get("rows", [])
    return table(result, rows, lambda r: "invariant attention's values against random vectors",
                 lambda r: r["values"], {k: k for k in (rows[0] if rows else {}) if k != "values"})


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=None, help="folder with the MNIST test split")
    p.add_argument("--n-train", type=int, default=8000)
    p.add_argument("--n-test", type=int, default=2000)
    p.add_argument("--n-components", type=int, default=50)
    p.add_argument("--max-rotation", type=float, default=60.0)
    p.add_argument("--n-rotations", type=int, default=24)
    p.add_argument("--n-neighbors", type=int, default=15)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    p.add_argument("--sweep", action="store_true", help="bandwidth / n_neighbors sweep only")
    p.add_argument("--eigencheck", action="store_true",
                   help="Eq.-11 check and projection loss of the invariant kernel only")
    p.add_argument("--quick", action="store_true", help="600 / 200 images, 12 angles")
    p.add_argument("--no-plot", action="store_true", help="accepted for symmetry; no plot")
    p.add_argument("--out", default=None,
                   help="folder for the JSON (default: examples/reproductions/results)")
    args = p.parse_args(argv)
    if args.quick:
        args.n_train, args.n_test, args.n_rotations = 600, 200, 12
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", torch.get_num_threads())))
    t_start = time.perf_counter()
    images, labels = load_mnist_test(args.data)
    out_dir = Path(args.out) if args.out else Path(__file__).resolve().parent / "results"
    path, quick = out_dir / "kpca_features.json", "_quick" if args.quick else ""
    config = {k: v for k, v in vars(args).items() if k not in ("out", "data")}
    if args.sweep:
        sweep = run_sweep(args, images, labels)
        print_table(sweep, ["n_neighbors", "bandwidth_factor", "accuracy", "seconds"])
        write_json({"benchmark": "kpca_features_sweep", "config": config,
                    "environment": environment(), "rows": sweep,
                    "wall_s": time.perf_counter() - t_start},
                   path, run="sweep" + quick)
        return
    if args.eigencheck:
        checks, losses, gram = run_eigencheck(args, images, labels)
        print_table(checks, ["values", "ratio_to_random", "rel_diff_mean",
                             "random_rel_diff_mean"])
        print_table(losses, ["n_components", "mean_j_proj", "mean_phi_q_sq_norm",
                             "mean_h_sq_norm", "fraction_negative_j"])
        print(gram)
        write_json({"benchmark": "kpca_invariant_eigencheck", "config": config,
                    "environment": environment(), "rows": checks, "projection_loss": losses,
                    "gram": gram, "wall_s": time.perf_counter() - t_start},
                   path, eigencheck_rows, run="eigencheck" + quick)
        return
    rows = []
    for variant in args.variants:
        Xtr, ytr, Xte, yte = make_split(images, labels, variant, args.n_train, args.n_test,
                                        args.seed)
        for name in args.methods:
            acc, sec = classify(make_step(name, args), Xtr, ytr, Xte, yte)
            rows.append({"data": variant, "features": name, "n_train": args.n_train,
                         "n_test": args.n_test, "accuracy": acc, "seconds": sec})
            print(f"{variant:<10} {name:<30} accuracy {acc:.4f}  {sec:7.1f} s", flush=True)
    digits = run_digits()
    print("\nMNIST test digits: test accuracy of LogisticRegression on each feature map")
    print_table(rows, ["data", "features", "n_train", "n_test", "accuracy", "seconds"])
    print("\nscikit-learn digits, 3-fold cross-validation")
    print_table(digits, ["pipeline", "cv3_accuracy", "seconds"])
    result = {"benchmark": "kpca_features", "config": config, "environment": environment(),
              "rows": rows, "digits_cv": digits, "wall_s": time.perf_counter() - t_start}
    write_json(result, path, table_rows, run="quick" if args.quick else "default")


if __name__ == "__main__":
    main()
