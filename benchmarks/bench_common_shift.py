"""Is a shift common to every image a symmetry of the search? (The reliability page's caveat.)

MNIST test digits (the first ``--n``, 500 by default), each rotated by a random angle
(``make_transformed(X, max_rotation=180, random_state=0)``) and padded with 4 px of zeros
(36 x 36, so that no content meets the frame), as they are and with every image moved by the
same integer shift ``s`` (1 or 2 px to the right, ``np.roll``). Four ways to search, all with
``max_rotation=180`` where they rotate:

- ``translation``: ``group="translation"``, ``max_translation=2``;
- ``se2``: ``group="se2"``, ``max_translation=2``;
- ``se2_wider``: ``group="se2"``, ``max_translation=2 + 2 s``;
- ``se2_centred``: ``group="se2"``, ``max_translation=2``, each image first moved so that its
  centre of mass is at the image centre (``scipy.ndimage.center_of_mass``,
  ``scipy.ndimage.shift``, order 1): the few lines a user can add.

Two scores per way and shift:

- the distances: ``invariant_distances`` among the first 150 images, shifted against as they
  are: median and largest relative change, and the share of each image's 10 nearest that stay;
- the partition: ``InvariantAttentionClusterer(n_clusters=None)`` and ``n_clusters=10``
  (``random_state=0``) fitted on both; the ARI between the two fits (1: the shift changed
  nothing) and each fit's ARI against the digits' classes.

Why: rotations turn about the image centre, so with the object ``s`` px off the centre, a
rotation by ``theta`` also moves it by ``2 s sin(theta / 2)`` px (up to ``2 s`` for a half turn);
the search finds a pair's alignment only if ``max_translation`` covers that on top of the shift
between the two images.

    python benchmarks/bench_common_shift.py            # results/common_shift.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from _common import RESULTS, environment, load_mnist_test
from scipy import ndimage
from sklearn.metrics import adjusted_rand_score

from invariant_cluster import InvariantAttentionClusterer, invariant_distances
from invariant_cluster.datasets import make_transformed


def centred(X):
    out = np.empty_like(X)
    centre = (np.array(X.shape[1:]) - 1) / 2
    for i, im in enumerate(X):
        com = np.array(ndimage.center_of_mass(np.clip(im, 0, None)))
        out[i] = ndimage.shift(im, centre - com, order=1, mode="constant")
    return out


WAYS = {
    "translation": lambda s: dict(group="translation", max_translation=2),
    "se2": lambda s: dict(group="se2", max_rotation=180, max_translation=2),
    "se2_wider": lambda s: dict(group="se2", max_rotation=180, max_translation=2 + 2 * s),
    "se2_centred": lambda s: dict(group="se2", max_rotation=180, max_translation=2),
}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=500)
    p.add_argument("--out", default=str(RESULTS / "common_shift.json"))
    p.add_argument("--ways", nargs="+", default=list(WAYS), choices=list(WAYS))
    p.add_argument("--append", action="store_true",
                   help="keep the rows already in --out (same --n) and run only the others")
    args = p.parse_args()
    X_all, y_all = load_mnist_test()
    X, _ = make_transformed(X_all[:args.n], max_rotation=180, random_state=0)
    # 4 px of empty border: no content meets the frame, whatever the shift and search
    X = np.pad(np.asarray(X, np.float32), ((0, 0), (4, 4), (4, 4)))
    y = y_all[:args.n]
    rows = []
    if args.append and Path(args.out).is_file():
        old = json.loads(Path(args.out).read_text())
        if old.get("n") == args.n:
            rows = old["rows"]
    done = {(r["way"], r["shift"]) for r in rows}
    for name in args.ways:
        params = WAYS[name]
        for s in (1, 2):
            if (name, s) in done:
                continue
            t0 = time.perf_counter()
            kw = params(s)
            A, B = X, np.roll(X, s, axis=2)
            if name == "se2_centred":
                A, B = centred(A), centred(B)
            D = invariant_distances(A[:150], A[:150], device="cpu", **kw)
            Ds = invariant_distances(B[:150], B[:150], device="cpu", **kw)
            off = ~np.eye(150, dtype=bool)
            rel = np.abs(Ds - D)[off] / np.maximum(D[off], 1e-12)
            big = np.eye(150) * 1e30
            nn, nns = np.argsort(D + big, 1)[:, :10], np.argsort(Ds + big, 1)[:, :10]
            row = {"way": name, "shift": s, "params": kw,
                   "distance_median_relative_change": float(np.median(rel)),
                   "distance_max_relative_change": float(rel.max()),
                   "knn10_kept": float(np.mean([len(set(a) & set(b)) / 10
                                                for a, b in zip(nn, nns)]))}
            for k in (None, 10):
                ref = InvariantAttentionClusterer(n_clusters=k, random_state=0, **kw).fit(A)
                out = InvariantAttentionClusterer(n_clusters=k, random_state=0, **kw).fit(B)
                row[f"n_clusters={k}"] = {
                    "ari_vs_unshifted": float(adjusted_rand_score(ref.labels_, out.labels_)),
                    "n_clusters_unshifted": int(ref.n_clusters_),
                    "n_clusters_shifted": int(out.n_clusters_),
                    "ari_truth_unshifted": float(adjusted_rand_score(y, ref.labels_)),
                    "ari_truth_shifted": float(adjusted_rand_score(y, out.labels_))}
            row["seconds"] = time.perf_counter() - t0
            rows.append(row)
            print(json.dumps(row), flush=True)
            _write(args, rows)  # after every row: a long run keeps what it measured


def _write(args, rows):
    order = {w: i for i, w in enumerate(WAYS)}
    rows = sorted(rows, key=lambda r: (order[r["way"]], r["shift"]))
    out = {"benchmark": "common_shift", "n": args.n,
           "command": f"python benchmarks/bench_common_shift.py --n {args.n}",
           "environment": environment(), "rows": rows}
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
