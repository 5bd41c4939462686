"""The command line ``invariant-cluster`` (also ``python -m invariant_cluster``).

Two commands:

- ``demo``: cluster randomly rotated digits (offline, scikit-learn's bundled 8 x 8 digits, or
  the MNIST test split with ``--data``) with k-means, kernel attention and invariant attention;
  print ACC / ARI / NMI / seconds, write ``invariant_means.png`` and ``metrics.json``.
- ``fit``: cluster your own images (``.npy``/``.npz``, IDX files or a folder of PNG/JPEG) and
  write ``labels.csv``, ``alignments.csv``, ``centers.png`` (and ``metrics.json`` when labels are
  given).
- ``neighbors``: the invariant k-nearest-neighbour graph of your images
  (:class:`~invariant_cluster.InvariantKNeighborsTransformer`): ``graph.npz``
  (``scipy.sparse.save_npz``), ``indices.npy``, ``distances.npy``, ``alignments.npy`` and
  ``neighbors.json``.

Importing this module is cheap (no torch, no NumPy): ``--help`` answers at once and every heavy
import happens inside the command that needs it.

Exit status: 0 on success, 2 for bad arguments or unreadable input (one line on stderr, no
traceback), 1 when the computation itself fails (e.g. out of memory), 130 on Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

PROG = "invariant-cluster"

_IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg"}


class UsageError(Exception):
    """Bad input found after parsing: reported as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are ONE line on stderr (argparse prints the usage too)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def _version():
    from . import __version__

    return __version__


# ---------------------------------------------------------------------------------------------
# argument types
# ---------------------------------------------------------------------------------------------


def _positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _nonnegative_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


def _nonnegative_float(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text!r}")
    return value


def _angle(text):
    value = _nonnegative_float(text)
    if value > 180:
        raise argparse.ArgumentTypeError(f"expected degrees in [0, 180], got {text!r}")
    return value


def _bandwidth(text):
    if text == "auto":
        return text
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected 'auto' or a positive number, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected 'auto' or a positive number, got {text!r}")
    return value


# ---------------------------------------------------------------------------------------------
# progress
# ---------------------------------------------------------------------------------------------


class _Progress:
    """A tqdm bar over a few named stages; the elapsed time ticks while a stage runs.

    The estimator has no progress callback, so a stage (e.g. the whole fit) is one step; a
    background thread refreshes the bar every half second so the elapsed time stays live.
    Shown only on a terminal (tqdm's ``disable=None``) and never with ``--quiet``.
    """

    def __init__(self, stages, quiet):
        from tqdm.auto import tqdm

        self.bar = tqdm(total=len(stages), disable=True if quiet else None, unit="stage",
                        file=sys.stderr, leave=False,
                        bar_format="{desc} {bar} {n_fmt}/{total_fmt} [{elapsed}]")

    @contextmanager
    def stage(self, name):
        self.bar.set_description_str(name)
        stop = threading.Event()

        def tick():
            while not stop.wait(0.5):
                self.bar.refresh()

        thread = None
        if not self.bar.disable:
            thread = threading.Thread(target=tick, daemon=True)
            thread.start()
        try:
            yield
        finally:
            stop.set()
            if thread is not None:
                thread.join()
        self.bar.update(1)

    def close(self):
        self.bar.close()


@contextmanager
def _warnings_as_lines(ignore=()):
    """Collect warnings and print each as one line on stderr (no source line, no traceback)."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        for category in ignore:
            warnings.filterwarnings("ignore", category=category)
        yield
    seen = set()
    for w in caught:
        text = " ".join(str(w.message).split())
        if text not in seen:
            seen.add(text)
            print(f"{PROG}: warning: {text}", file=sys.stderr)


# ---------------------------------------------------------------------------------------------
# loading
# ---------------------------------------------------------------------------------------------


def _as_images(array, source, image_shape):
    """Float32 images ``(n, C, H, W)`` from a numeric array, with clear errors."""
    import numpy as np

    a = np.asarray(array)
    if a.dtype == bool:
        a = a.astype(np.float32)
    if not np.issubdtype(a.dtype, np.number) or np.iscomplexobj(a):
        raise UsageError(f"{source}: expected a real numeric array, got dtype {a.dtype}")
    if a.ndim not in (2, 3, 4):
        raise UsageError(
            f"{source}: expected an array of shape (n, n_features), (n, H, W) or (n, C, H, W), "
            f"got shape {a.shape}"
        )
    if a.shape[0] < 2:
        raise UsageError(f"{source}: expected at least 2 images, got {a.shape[0]}")
    if a.dtype == np.uint8:
        a = a.astype(np.float32) / 255.0
    else:
        a = a.astype(np.float32)
    if not np.isfinite(a).all():
        raise UsageError(f"{source}: contains NaN or infinity")
    n = a.shape[0]
    if image_shape is not None:
        shape = tuple(image_shape)
        if len(shape) == 2:
            shape = (1, *shape)
        size = math.prod(a.shape[1:])
        if math.prod(shape) != size:
            raise UsageError(
                f"--image-shape: {' '.join(map(str, image_shape))} holds {math.prod(shape)} "
                f"values but each sample of {source} has {size}"
            )
        return a.reshape(n, *shape)
    if a.ndim == 2:
        side = math.isqrt(a.shape[1])
        if side * side != a.shape[1]:
            raise UsageError(
                f"{source}: rows of {a.shape[1]} values are not square images; give "
                "--image-shape H W (or C H W)"
            )
        return a.reshape(n, 1, side, side)
    return a.reshape(n, 1, *a.shape[1:]) if a.ndim == 3 else a


def _load_npz(path):
    import numpy as np

    with np.load(path, allow_pickle=False) as z:
        keys = list(z.keys())
        xkey = next((k for k in ("X", "data", "x", "images") if k in z), None)
        if xkey is None:
            raise UsageError(
                f"{path}: expected an array named 'X' or 'data' in the .npz file, found "
                f"{', '.join(keys) or 'no arrays'}"
            )
        ykey = next((k for k in ("y", "target", "labels") if k in z), None)
        return z[xkey], (z[ykey] if ykey else None)


def _load_folder(path):
    import numpy as np
    from PIL import Image, UnidentifiedImageError

    files = sorted(p for p in path.iterdir()
                   if p.is_file() and p.suffix.lower() in _IMAGE_SUFFIXES)
    if not files:
        raise UsageError(f"{path}: no PNG or JPEG images (*.png, *.jpg, *.jpeg) in this folder")
    images, first = [], None
    for f in files:
        try:
            with Image.open(f) as im:
                a = np.asarray(im.convert("L"), dtype=np.uint8)
        except (UnidentifiedImageError, OSError) as exc:
            raise UsageError(f"{f}: cannot read this image ({exc})") from None
        if first is None:
            first = (f, a.shape)
        elif a.shape != first[1]:
            raise UsageError(
                f"{path}: all images must have the same size, but {first[0].name} is "
                f"{first[1][1]}x{first[1][0]} and {f.name} is {a.shape[1]}x{a.shape[0]} "
                "(width x height); resize them first"
            )
        images.append(a)
    return np.stack(images), [f.name for f in files]


def _kind(path):
    suffix = path.suffix.lower()
    return {".npy": "a NumPy .npy file", ".npz": "a NumPy .npz archive"}.get(
        suffix, "an IDX file")


def _load_labels(path):
    import numpy as np

    path = Path(path)
    if not path.is_file():
        raise UsageError(f"--labels {path}: no such file")
    suffix = path.suffix.lower()
    if suffix == ".npy":
        y = np.load(path, allow_pickle=False)
    elif suffix == ".npz":
        with np.load(path, allow_pickle=False) as z:
            key = next((k for k in ("y", "target", "labels") if k in z), None)
            if key is None:
                raise UsageError(f"--labels {path}: expected an array named 'y' or 'target'")
            y = z[key]
    elif suffix in (".csv", ".txt"):
        y = np.loadtxt(path, dtype=str, delimiter=",", ndmin=1)
        if y.ndim != 1:
            raise UsageError(f"--labels {path}: expected one label per line")
    else:
        from .datasets import load_idx

        y = load_idx(path)
    y = np.asarray(y)
    if y.ndim != 1:
        raise UsageError(f"--labels {path}: expected one label per sample, got shape {y.shape}")
    return y


def load_input(path, labels=None, image_shape=None):
    """Read the ``fit`` command's input.

    Parameters
    ----------
    path : str or Path
        A ``.npy`` array, a ``.npz`` archive (images under ``X`` or ``data``, optional labels
        under ``y`` or ``target``), an IDX file (``*-idx3-ubyte[.gz]``, any other name is read
        as IDX too) or a folder of PNG/JPEG images of one size (read as grey levels, sorted by
        file name).
    labels : str or Path, optional
        Labels: ``.npy``, ``.npz``, ``.csv``/``.txt`` (one per line) or IDX.
    image_shape : tuple of int, optional
        ``(H, W)`` or ``(C, H, W)`` to fold 2-D rows (default: square single-channel images).

    Returns
    -------
    X : ndarray of shape (n, C, H, W), float32
        uint8 input is scaled to [0, 1]; other types are converted as they are.
    y : ndarray of shape (n,) or None
    names : list of str or None
        File names for a folder input.

    Raises
    ------
    UsageError, ValueError, OSError
        With a message that names the file and what is wrong.
    """
    import numpy as np

    path = Path(path)
    names, y = None, None
    if not path.exists():
        raise UsageError(f"{path}: no such file or folder")
    if path.is_dir():
        array, names = _load_folder(path)
    else:
        try:
            if path.suffix.lower() == ".npy":
                array = np.load(path, allow_pickle=False)
            elif path.suffix.lower() == ".npz":
                array, y = _load_npz(path)
            else:
                from .datasets import load_idx

                array = load_idx(path)
        except (ValueError, OSError, EOFError) as exc:
            msg = " ".join(str(exc).split())
            if str(path) not in msg:
                msg = f"{path}: cannot read it as {_kind(path)} ({msg})"
            raise UsageError(msg) from None
    X = _as_images(array, path, image_shape)
    if labels is not None:
        try:
            y = _load_labels(labels)
        except (ValueError, OSError, EOFError) as exc:
            msg = " ".join(str(exc).split())
            raise UsageError(f"--labels {labels}: cannot read it ({msg})") from None
    if y is not None:
        y = np.asarray(y).ravel() if np.asarray(y).ndim > 1 else np.asarray(y)
        if len(y) != len(X):
            raise UsageError(
                f"labels: expected one label per image ({len(X)}), got {len(y)}"
            )
    return X, y, names


# ---------------------------------------------------------------------------------------------
# fit
# ---------------------------------------------------------------------------------------------

_FIT_DESCRIPTION = """\
Cluster images so that rotated (and shifted) copies of the same shape land in the same cluster.

Every image attends to its nearest neighbours under the invariant distance
min over rotations/shifts of ||x - T y||^2 and moves to the weighted average of their ALIGNED
versions; iterating collapses each cluster onto its invariant mean (its "center").

Input: a .npy array, a .npz archive (images under X or data, labels under y or target), IDX
files (the MNIST format, e.g. t10k-images-idx3-ubyte.gz, labels with --labels) or a folder of
PNG/JPEG images of one size (read in grey levels, sorted by name). uint8 pixels are scaled to
[0, 1]. Arrays may be (n, H, W), (n, C, H, W), or (n, H*W) with square images (else give
--image-shape).

Output (in --out): labels.csv, alignments.csv (the rotation in degrees and shift in pixels
that move each image onto its cluster's center), centers.png, centers.npy, and metrics.json
(ACC, ARI, NMI) when labels are known."""

_FIT_EPILOG = """\
examples:
  invariant-cluster fit digits.npy --n-clusters 10 --max-rotation 60
  invariant-cluster fit data.npz --group se2 --max-translation 3 --out results/
  invariant-cluster fit t10k-images-idx3-ubyte.gz --labels t10k-labels-idx1-ubyte.gz \\
      --n-samples 500 --n-clusters 10 --max-rotation 60 --n-rotations 25
  invariant-cluster fit photos/ --group rotation --max-rotation 180 --device cuda

Options left out keep the defaults of invariant_cluster.InvariantAttentionClusterer (see
help(InvariantAttentionClusterer) in Python). The cost grows with n^2 x n-rotations x pixels:
on a CPU, start with a few hundred images; a GPU (--device cuda) takes thousands."""


def _add_estimator_options(p, *, with_rotation=True):
    g = p.add_argument_group("clustering (InvariantAttentionClusterer's parameters)")
    g.add_argument("--n-clusters", type=_positive_int, metavar="K",
                   help="number of clusters; omit to let them emerge from the data")
    g.add_argument("--group", choices=["se2", "rotation", "translation", "none"],
                   help="transformations searched: se2 (rotations and shifts), rotation, "
                        "translation, or none (plain kernel attention, the baseline)")
    if with_rotation:
        g.add_argument("--max-rotation", type=_angle, metavar="DEG",
                       help="search rotations within +-DEG degrees (0..180)")
    g.add_argument("--n-rotations", type=_positive_int, metavar="R",
                   help="angles in the rotation grid (refined continuously afterwards)")
    g.add_argument("--max-translation", type=_nonnegative_float, metavar="PX",
                   help="search shifts within +-PX pixels")
    g.add_argument("--n-neighbors", type=_positive_int, metavar="N",
                   help="each image attends to its N nearest neighbours")
    g.add_argument("--bandwidth", type=_bandwidth, metavar="auto|SIGMA",
                   help="kernel width: 'auto' (per image, from its neighbours) or a number in "
                        "pixel units")
    g.add_argument("--update", choices=["blurring", "fixed"],
                   help="blurring: attend to the current means; fixed: to the original images "
                        "(mean shift)")
    g.add_argument("--max-iter", type=_nonnegative_int, metavar="N",
                   help="most attention iterations")
    g.add_argument("--tol", type=_nonnegative_float, help="stop when the means move less")
    g.add_argument("--no-refine", dest="refine", action="store_false", default=None,
                   help="keep the grid's alignments (skip the continuous refinement)")
    r = p.add_argument_group("running")
    r.add_argument("--device", metavar="DEV",
                   help="auto (a GPU when there is one), cpu, cuda or cuda:N")
    r.add_argument("--batch-size", type=_positive_int, metavar="B",
                   help="queries per block of the alignment search (lower it if memory runs "
                        "out)")
    r.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    r.add_argument("--verbose", "-v", action="count", default=0,
                   help="print the estimator's progress (per iteration)")
    r.add_argument("--quiet", "-q", action="store_true", help="no progress bar")


def _estimator_params(args, **fixed):
    """Only the options the user gave, so that the estimator's own defaults apply otherwise."""
    names = ["n_clusters", "group", "max_rotation", "n_rotations", "max_translation",
             "n_neighbors", "bandwidth", "update", "max_iter", "tol", "refine", "device",
             "batch_size"]
    params = {k: getattr(args, k) for k in names if getattr(args, k, None) is not None}
    params["random_state"] = args.seed
    params["verbose"] = args.verbose
    params.update(fixed)
    return params


def _write_csv(path, header, rows):
    import csv

    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)


def _environment():
    import platform

    import torch

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "invariant_cluster": _version(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }


def _cmd_fit(args):
    progress = _Progress(["load", "fit", "write"], args.quiet)
    try:
        with progress.stage("loading"):
            X, y, names = load_input(args.input, args.labels, args.image_shape)
            if args.n_samples is not None:
                X = X[: args.n_samples]
                y = None if y is None else y[: args.n_samples]
                names = None if names is None else names[: args.n_samples]
        out = Path(args.out)
        with progress.stage(f"fitting {len(X)} images"):
            from .cluster import InvariantAttentionClusterer

            est = InvariantAttentionClusterer(**_estimator_params(args))
            t0 = time.perf_counter()
            with _warnings_as_lines():
                est.fit(X)
            seconds = time.perf_counter() - t0
        with progress.stage("writing"):
            _write_fit_outputs(out, est, X, y, names, seconds, args)
    finally:
        progress.close()
    sizes = [int((est.labels_ == c).sum()) for c in range(est.n_clusters_)]
    print(f"{len(X)} images -> {est.n_clusters_} clusters (sizes {sizes}) in {seconds:.1f} s, "
          f"{est.n_iter_} iterations")
    if y is not None:
        from .metrics import clustering_scores

        s = clustering_scores(y, est.labels_)
        print(f"against the labels: ACC {s['ACC']:.3f}  ARI {s['ARI']:.3f}  NMI {s['NMI']:.3f}")
    print(f"wrote {out}/")
    return 0


def _write_fit_outputs(out, est, X, y, names, seconds, args):
    import numpy as np

    from .plotting import plot_invariant_means

    out.mkdir(parents=True, exist_ok=True)
    ids = names if names is not None else list(range(len(X)))
    id_col = "file" if names is not None else "index"
    labels = est.labels_
    header = [id_col, "label"] + (["true_label"] if y is not None else [])
    rows = [[ids[i], int(labels[i])] + ([y[i].item()] if y is not None else [])
            for i in range(len(X))]
    _write_csv(out / "labels.csv", header, rows)
    a = est.alignments_
    _write_csv(out / "alignments.csv", [id_col, "label", "angle_deg", "tx_px", "ty_px"],
               [[ids[i], int(labels[i]), f"{a[i, 0]:.4f}", f"{a[i, 1]:.4f}", f"{a[i, 2]:.4f}"]
                for i in range(len(X))])
    np.save(out / "centers.npy", est.cluster_centers_.reshape(-1, *est.image_shape_))
    _save_figure(plot_invariant_means(est, max_clusters=50), out / "centers.png")
    if y is not None:
        from .metrics import clustering_scores

        params = {k: (v if isinstance(v, (int, float, str, bool, type(None))) else str(v))
                  for k, v in est.get_params().items()}
        report = {
            "input": str(args.input),
            "n_samples": int(len(X)),
            "n_clusters": int(est.n_clusters_),
            "n_classes": int(len(np.unique(y))),
            **clustering_scores(y, labels),
            "seconds": seconds,
            "n_iter": int(est.n_iter_),
            "params": params,
            "environment": _environment(),
        }
        (out / "metrics.json").write_text(json.dumps(report, indent=2) + "\n")


def _save_figure(ax, path):
    import matplotlib.pyplot as plt

    fig = ax.figure
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------
# demo
# ---------------------------------------------------------------------------------------------

_DEMO_DESCRIPTION = """\
Cluster randomly rotated handwritten digits three ways and compare them with the true digits:
k-means on the pixels, kernel attention (attention without alignment, the baseline) and
invariant attention (attention that aligns images before comparing them).

Works offline on scikit-learn's bundled 8x8 digits; with --data, on the MNIST test split
(28x28). Prints ACC (accuracy under the best matching of clusters to digits), ARI, NMI and the
seconds each method took, and writes invariant_means.png and metrics.json to --out."""

_DEMO_EPILOG = """\
examples:
  invariant-cluster demo
  invariant-cluster demo --max-rotation 90 --n-samples 300 --out /tmp/demo
  invariant-cluster demo --data ~/mnist --n-samples 300 --device cuda
  python -m invariant_cluster demo --n-samples 60       # a few seconds

The invariant search covers +-(max-rotation + 15) degrees (up to 180), at about 5 degree
steps unless --n-rotations says otherwise."""

_DEMO_N_DIGITS = 1000  # 8 x 8 digits: about a minute on 2 shared CPU cores (measured)
_DEMO_N_MNIST = 300   # 28 x 28 images cost about 12 times more per pair


def _demo_data(args):
    import numpy as np

    from .datasets import load_digits_images, load_mnist, make_transformed

    if args.data is None:
        X, y = load_digits_images(return_X_y=True)
        X = X.reshape(-1, 8, 8)
        name = "scikit-learn digits (8x8)"
        default_n = _DEMO_N_DIGITS
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
        default_n = _DEMO_N_MNIST
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


def _print_table(rows):
    cols = ["method", "ACC", "ARI", "NMI", "seconds"]
    cells = [[r["method"], f"{r['ACC']:.3f}", f"{r['ARI']:.3f}", f"{r['NMI']:.3f}",
              f"{r['seconds']:.1f}"] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    line = "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                     for i, (c, w) in enumerate(zip(cols, widths)))
    print(line)
    print("  ".join("-" * w for w in widths))
    for row in cells:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                        for i, (c, w) in enumerate(zip(row, widths))))


def _cmd_demo(args):
    progress = _Progress(["data", "k-means", "kernel", "invariant", "write"], args.quiet)
    search = min(180.0, args.max_rotation + 15.0)
    n_rot = args.n_rotations or 2 * math.ceil(search / 5.0) + 1
    rows = []
    try:
        with progress.stage("loading the data"):
            X, y, name = _demo_data(args)
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
        with progress.stage("writing"):
            import numpy as np

            from .plotting import plot_invariant_means

            out = Path(args.out)
            out.mkdir(parents=True, exist_ok=True)
            # "c3: mostly 7" — the cluster's index and its most common true digit, so that the
            # caption is not read as the digit itself
            majority = [int(np.bincount(y[invariant.labels_ == c], minlength=1).argmax())
                        for c in range(invariant.n_clusters_)]
            ax = plot_invariant_means(
                invariant, title=f"invariant means: {n} digits rotated within "
                                 f"±{args.max_rotation:g}°",
                captions=[f"c{c}: mostly {d}" for c, d in enumerate(majority)])
            _save_figure(ax, out / "invariant_means.png")
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
            (out / "metrics.json").write_text(json.dumps(report, indent=2) + "\n")
    finally:
        progress.close()
    print()
    _print_table(rows)
    print(f"\nwrote {out / 'invariant_means.png'} and {out / 'metrics.json'}")
    return 0


# ---------------------------------------------------------------------------------------------
# parser and entry point
# ---------------------------------------------------------------------------------------------


_NEIGHBORS_DESCRIPTION = """\
Compute the invariant k-nearest-neighbour graph of your images: for each image, the K other
images nearest to it after the best rotation (and shift) of each one onto it, as
InvariantKNeighborsTransformer's fit_transform gives it (each image is its own first neighbour,
at distance 0, then its K nearest).

Writes into --out:
  graph.npz        (n, n) CSR distance graph, K + 1 entries per row sorted by distance
                   (scipy.sparse.load_npz; feed it to any metric="precomputed" estimator)
  indices.npy      (n, K + 1) neighbour indices, the graph's entries row by row
  distances.npy    (n, K + 1) invariant distances sqrt(min ||x - T y||^2)
  alignments.npy   (n, K + 1, 3) (angle in degrees, tx, ty in pixels) warping each neighbour
                   onto its image (warp_se2(images[indices[i, j]], alignments[i, j]) ~ images[i])
  neighbors.json   parameters, seconds, environment
"""

_NEIGHBORS_EPILOG = """\
examples:
  invariant-cluster neighbors images.npy --n-neighbors 15 --out knn
  invariant-cluster neighbors t10k-images-idx3-ubyte.gz --n-samples 2000 --max-rotation 45
"""


def _cmd_neighbors(args):
    import numpy as np
    from scipy import sparse

    progress = _Progress(["load", "search", "write"], args.quiet)
    try:
        with progress.stage("loading"):
            X, _, _ = load_input(args.input, None, args.image_shape)
            if args.n_samples is not None:
                X = X[: args.n_samples]
        if args.n_neighbors >= len(X):
            raise UsageError(f"--n-neighbors: expected fewer than the {len(X)} images, got "
                             f"{args.n_neighbors}")
        names = ["group", "max_rotation", "n_rotations", "max_translation", "refine",
                 "neighbor_search", "n_candidates", "device", "batch_size"]
        params = {k: getattr(args, k) for k in names if getattr(args, k, None) is not None}
        with progress.stage(f"searching the neighbours of {len(X)} images"):
            from .kneighbors import InvariantKNeighborsTransformer, _csr

            est = InvariantKNeighborsTransformer(n_neighbors=args.n_neighbors, **params)
            t0 = time.perf_counter()
            with _warnings_as_lines():
                est.fit(X)
                dist, ind, tau = est.kneighbors(X, n_neighbors=args.n_neighbors + 1,
                                                return_alignments=True)
            seconds = time.perf_counter() - t0
        with progress.stage("writing"):
            out = Path(args.out)
            out.mkdir(parents=True, exist_ok=True)
            sparse.save_npz(out / "graph.npz", _csr(dist, ind, len(X)))
            np.save(out / "indices.npy", ind)
            np.save(out / "distances.npy", dist)
            np.save(out / "alignments.npy", tau)
            info = {"input": str(args.input), "n_images": len(X),
                    "image_shape": list(est.image_shape_), "n_neighbors": args.n_neighbors,
                    "params": est.get_params(deep=False) | {"client": None,
                                                           "device": str(est.device)},
                    "seconds": seconds, "environment": _environment()}
            (out / "neighbors.json").write_text(json.dumps(info, indent=2, default=str) + "\n")
    finally:
        progress.close()
    print(f"{len(X)} images -> invariant {args.n_neighbors}-NN graph in {seconds:.1f} s; "
          f"median distance to the nearest other image {float(np.median(dist[:, 1])):.3g}")
    print(f"wrote {out}/")
    return 0


def build_parser():
    """The argument parser of ``invariant-cluster`` (no heavy imports)."""
    p = _Parser(
        prog=PROG,
        description="Cluster images invariantly to rotations and translations with invariant "
                    "attention (and compare with k-means and kernel attention).",
        epilog="examples:\n"
               "  invariant-cluster demo                 # offline demo, about a minute\n"
               "  invariant-cluster fit images.npy --n-clusters 10 --max-rotation 60\n"
               "  invariant-cluster fit --help           # every option of fit\n"
               "  invariant-cluster neighbors images.npy --n-neighbors 15 --out knn\n",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True,
                           parser_class=_Parser)

    d = sub.add_parser("demo", help="compare k-means, kernel and invariant attention on "
                                    "rotated digits (offline)",
                       description=_DEMO_DESCRIPTION, epilog=_DEMO_EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    d.add_argument("--data", metavar="PATH",
                   help="folder holding the MNIST test split (t10k-*-ubyte[.gz]); default: "
                        "scikit-learn's bundled digits, no download")
    d.add_argument("--n-samples", type=_positive_int, metavar="N",
                   help=f"images to cluster (default: {_DEMO_N_DIGITS} digits, "
                        f"{_DEMO_N_MNIST} with --data)")
    d.add_argument("--max-rotation", type=_angle, default=45.0, metavar="DEG",
                   help="rotate each image by a random angle within +-DEG degrees (default: 45)")
    d.add_argument("--n-rotations", type=_positive_int, metavar="R",
                   help="angles in invariant attention's rotation grid (default: about one "
                        "per 5 degrees)")
    d.add_argument("--max-iter", type=_nonnegative_int, default=None, metavar="N",
                   help="most attention iterations of both attention methods (default: the "
                        "estimator's, which converges)")
    d.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    d.add_argument("--device", default="auto", metavar="DEV",
                   help="auto (default; a GPU when there is one), cpu, cuda or cuda:N")
    d.add_argument("--out", default="invariant_cluster_demo", metavar="DIR",
                   help="output folder (default: ./invariant_cluster_demo)")
    d.add_argument("--verbose", "-v", action="count", default=0,
                   help="print the estimators' progress")
    d.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    d.set_defaults(func=_cmd_demo)

    f = sub.add_parser("fit", help="cluster your own images (.npy/.npz, IDX, or a folder of "
                                   "PNG/JPEG)",
                       description=_FIT_DESCRIPTION, epilog=_FIT_EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    f.add_argument("input", metavar="INPUT",
                   help="a .npy/.npz file, an IDX file, or a folder of PNG/JPEG images")
    f.add_argument("--labels", metavar="PATH",
                   help="true labels to score against (.npy, .npz, .csv/.txt or IDX)")
    f.add_argument("--image-shape", type=_positive_int, nargs="+", metavar="N",
                   help="H W (or C H W) to fold rows that are not square images")
    f.add_argument("--n-samples", type=_positive_int, metavar="N",
                   help="use only the first N images")
    f.add_argument("--out", default="invariant_cluster_out", metavar="DIR",
                   help="output folder (default: ./invariant_cluster_out)")
    _add_estimator_options(f)
    f.set_defaults(func=_cmd_fit)

    nb = sub.add_parser("neighbors", help="the invariant k-nearest-neighbour graph of your "
                                          "images (graph.npz + alignments)",
                        description=_NEIGHBORS_DESCRIPTION, epilog=_NEIGHBORS_EPILOG,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    nb.add_argument("input", metavar="IMAGES",
                    help="a .npy/.npz file, an IDX file, or a folder of PNG/JPEG images")
    nb.add_argument("--n-neighbors", type=_positive_int, default=5, metavar="K",
                    help="neighbours per image, besides itself (default: 5)")
    nb.add_argument("--out", default="invariant_cluster_neighbors", metavar="DIR",
                    help="output folder (default: ./invariant_cluster_neighbors)")
    nb.add_argument("--image-shape", type=_positive_int, nargs="+", metavar="N",
                    help="H W (or C H W) to fold rows that are not square images")
    nb.add_argument("--n-samples", type=_positive_int, metavar="N",
                    help="use only the first N images")
    g = nb.add_argument_group("search (InvariantKNeighborsTransformer's parameters)")
    g.add_argument("--group", choices=["se2", "rotation", "translation", "none"],
                   help="transformations searched (default: se2)")
    g.add_argument("--max-rotation", type=_angle, metavar="DEG",
                   help="search rotations within +-DEG degrees (default: 180)")
    g.add_argument("--n-rotations", type=_positive_int, metavar="R",
                   help="angles in the rotation grid (default: 36)")
    g.add_argument("--max-translation", type=_nonnegative_float, metavar="PX",
                   help="search shifts within +-PX pixels (default: 0)")
    g.add_argument("--no-refine", dest="refine", action="store_false", default=None,
                   help="keep the grid's alignments (skip the continuous refinement)")
    g.add_argument("--neighbor-search", choices=["auto", "exact", "shortlist"],
                   help="exact, descriptor shortlist, or auto (default: exact up to 4000 "
                        "images with 36 angles)")
    g.add_argument("--n-candidates", type=_positive_int, metavar="C",
                   help="shortlist length per image")
    r = nb.add_argument_group("running")
    r.add_argument("--device", metavar="DEV",
                   help="auto (a GPU when there is one), cpu, cuda or cuda:N")
    r.add_argument("--batch-size", type=_positive_int, metavar="B",
                   help="block size of the search (lower it if memory runs out)")
    r.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    nb.set_defaults(func=_cmd_neighbors)
    return p


def _one_line(exc):
    text = " ".join(str(exc).split())
    if isinstance(exc, KeyError):
        text = f"missing key {text}"
    return text or type(exc).__name__


def main(argv=None):
    """Run the command line; returns the exit status (0 success, 1 failure, 2 bad input)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "image_shape", None) is not None and len(args.image_shape) not in (2, 3):
        parser.error("--image-shape: expected H W or C H W")
    cmd = f"{PROG} {args.command}"
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print(f"{cmd}: interrupted", file=sys.stderr)
        return 130
    except (UsageError, ValueError, TypeError, OSError, KeyError) as exc:
        print(f"{cmd}: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except (RuntimeError, MemoryError) as exc:
        print(f"{cmd}: failed: {_one_line(exc)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
