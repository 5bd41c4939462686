"""The work of ``invariant-cluster demo`` (:mod:`invariant_cluster.cli` holds its options):
k-means, kernel attention and invariant attention on rotated digits, compared.

Importing this module is cheap (no torch, no NumPy), as the command line's ``--help`` needs.
"""

from __future__ import annotations

import json
import math
import time

from ._cli_support import (
    UsageError,
    _check_out,
    _environment,
    _print_table,
    _replacing,
    _save_figure,
    _warnings_as_lines,
)
from ._progress import StageBar

N_DIGITS = 1000  # 8 x 8 digits: about a minute on 2 shared CPU cores (measured)
N_MNIST = 300   # 28 x 28 images cost about 12 times more per pair
FILES = ("invariant_means.png", "demo.json")  # the demo's own files in --out


def _data(args):
    import numpy as np

    from .datasets import load_digits_images, load_mnist, make_transformed

    if args.data is None:
        X, y = load_digits_images(return_X_y=True)
        X = X.reshape(-1, 8, 8)
        name = "scikit-learn digits (8x8)"
        default_n = N_DIGITS
    else:
        try:
            X, y = load_mnist(split="test", data_home=args.data, return_X_y=True)
        except FileNotFoundError:
            raise UsageError(
                f"--data {args.data}: no MNIST test split there (t10k-images-idx3-ubyte[.gz] "
                "and t10k-labels-idx1-ubyte[.gz], in that folder or its mnist/ subfolder)"
            ) from None
        X = X.reshape(-1, 28, 28)
        name = "MNIST test split (28x28)"
        default_n = N_MNIST
    n = default_n if args.n_samples is None else args.n_samples
    if n > len(X):
        raise UsageError(f"--n-samples: expected at most {len(X)} for this data, got {n}")
    if n < 20:
        raise UsageError(f"--n-samples: expected at least 20 (10 digit classes), got {n}")
    rng = np.random.default_rng(args.seed)
    sel = np.sort(rng.choice(len(X), n, replace=False))
    X, y = X[sel], y[sel]
    Xr, _ = make_transformed(X, max_rotation=args.max_rotation, random_state=args.seed)
    return Xr.astype(np.float32), y, name


def run(args):
    """``invariant-cluster demo``."""
    progress = StageBar(["data", "k-means", "kernel", "invariant", "write"], args.quiet)
    search = min(180.0, args.max_rotation + 15.0)
    n_rot = args.n_rotations or 2 * math.ceil(search / 5.0) + 1
    rows = []
    out = _check_out(args.out)
    try:
        with progress.stage("loading the data"):
            X, y, name = _data(args)
        n = len(X)
        print(f"{name}: {n} images rotated uniformly within +-{args.max_rotation:g} degrees "
              f"(seed {args.seed})")
        from sklearn.cluster import KMeans

        from .cluster import InvariantAttentionClusterer
        from .metrics import clustering_scores

        with progress.stage("k-means"):
            t0 = time.perf_counter()
            labels = KMeans(10, n_init=10, random_state=args.seed).fit_predict(X.reshape(n, -1))
            rows.append({"method": "k-means (pixels)", **clustering_scores(y, labels),
                         "seconds": time.perf_counter() - t0})
        from sklearn.exceptions import ConvergenceWarning

        common = dict(n_clusters=10, random_state=args.seed, device=args.device,
                      verbose=args.verbose)
        if args.max_iter is not None:
            common["max_iter"] = args.max_iter
        kernel = InvariantAttentionClusterer(group="none", **common)
        invariant = InvariantAttentionClusterer(group="rotation", max_rotation=search,
                                                n_rotations=n_rot, **common)
        for method, est, stage in (("kernel attention", kernel, "kernel attention"),
                                   ("invariant attention", invariant, "invariant attention")):
            # a --max-iter given on purpose may stop early; "did not converge" would only confuse
            ignore = [ConvergenceWarning] if args.max_iter is not None else []
            with progress.stage(stage), _warnings_as_lines(ignore=ignore):
                t0 = time.perf_counter()
                est.fit(X)
                rows.append({"method": method, **clustering_scores(y, est.labels_),
                             "seconds": time.perf_counter() - t0, "n_iter": int(est.n_iter_),
                             "converged": bool(est.history_ and est.history_[-1] <= est.tol),
                             "n_clusters": int(est.n_clusters_)})
        with progress.stage("writing"), _replacing(out, FILES) as stage:
            import numpy as np

            from .plotting import plot_invariant_means

            # "c3: mostly 7" — the cluster's index and its most common true digit, so that the
            # caption is not read as the digit itself
            majority = [int(np.bincount(y[invariant.labels_ == c], minlength=1).argmax())
                        for c in range(invariant.n_clusters_)]
            ax = plot_invariant_means(
                invariant, title=f"invariant means: {n} digits rotated within "
                                 f"±{args.max_rotation:g}°",
                captions=[f"c{c}: mostly {d}" for c, d in enumerate(majority)])
            _save_figure(ax, stage / "invariant_means.png")
            report = {
                "data": name,
                "n_samples": n,
                "max_rotation": args.max_rotation,
                "seed": args.seed,
                "invariant_search": {"max_rotation": search, "n_rotations": n_rot},
                "max_iter": invariant.max_iter,
                "results": rows,
                "environment": _environment(),
            }
            (stage / "demo.json").write_text(json.dumps(report, indent=2) + "\n")
    finally:
        progress.close()
    print()
    _print_table(rows)
    print(f"\nwrote {out / 'invariant_means.png'} and {out / 'demo.json'}")
    return 0
