"""The command line ``invariant-cluster`` (also ``python -m invariant_cluster``).

Four commands:

- ``demo``: cluster randomly rotated digits (offline, scikit-learn's bundled 8 x 8 digits, or
  the MNIST test split with ``--data``) with k-means, kernel attention and invariant attention;
  print ACC / ARI / NMI / seconds, write ``invariant_means.png`` and ``demo.json``.
- ``fit``: cluster your own images (``.npy``/``.npz``, MRC stacks ``.mrcs``/``.mrc``, IDX files
  or a folder of PNG/JPEG) and write ``labels.csv``, ``alignments.csv``, ``centers.png`` (and
  ``metrics.json`` when labels are given).
- ``class-averages``: fit as ``fit`` does and write each image's class average in its own pose
  (the invariant mean it converged to) as an MRC stack, ``class_averages.mrcs``; or, with
  ``--one-step`` (or ``--denoise`` / ``--center``), the one-step average of each image's
  invariant neighbours (:func:`~invariant_cluster.class_averages`), searched on a denoised copy
  with ``--denoise``.
- ``neighbors``: the invariant k-nearest-neighbour graph of your images
  (:class:`~invariant_cluster.InvariantKNeighborsTransformer`): ``graph.npz``
  (``scipy.sparse.save_npz``), ``indices.npy``, ``distances.npy``, ``alignments.npy`` and
  ``neighbors.json``.

Importing this module is cheap (no torch, no NumPy): ``--help`` answers at once and every heavy
import happens inside the command that needs it. The readers of the input files live in
:mod:`invariant_cluster.datasets`, the small helpers in ``_cli_support``.

Each command checks that ``--out`` is writable before its long part. No two commands write a
file of the same name, so that they can share a folder: a command writes its files into a
staging folder inside ``--out`` and, once all are written, puts them in place of its own files
of an earlier run (those this run does not write are removed), never touching another
command's; a run that fails leaves the folder as it was.

Exit status: 0 on success, 2 for bad arguments or unreadable input (one line on stderr, no
traceback), 1 when the computation itself fails (e.g. out of memory), 130 on Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from . import _cli_averages, _cli_demo
from ._cli_support import (
    PROG,
    UsageError,
    _angle,
    _bandwidth,
    _check_finite,
    _check_out,
    _components,
    _environment,
    _noise_std,
    _nonnegative_float,
    _nonnegative_int,
    _number,
    _positive_int,
    _replacing,
    _save_figure,
    _version,
    _warnings_as_lines,
    _write_csv,
    _write_labels,
    shared_options,
)
from ._progress import StageBar


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are ONE line on stderr (argparse prints the usage too)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


# ---------------------------------------------------------------------------------------------
# fit
# ---------------------------------------------------------------------------------------------

_FIT_DESCRIPTION = """\
Cluster images so that rotated (and shifted) copies of the same shape land in the same cluster.

Every image attends to its nearest neighbours under the invariant distance
min over rotations/shifts of ||x - T y||^2 and moves to the weighted average of their ALIGNED
versions; iterating collapses each cluster onto its invariant mean (its "center").

Input: a .npy array, a .npz archive (images under X or data, labels under y or target), an
MRC stack (.mrcs, or .mrc holding a stack; pip install invariant_cluster[mrc]), IDX files (the
MNIST format, e.g. t10k-images-idx3-ubyte.gz, labels with --labels) or a folder of images
(PNG, JPEG, TIFF, BMP; read in grey levels, sorted by name) of one size, or of any sizes with
--image-size N (each scaled and centred on an N x N canvas; --invert for dark objects on a
light background). Pixels are taken at their values,
as the Python API takes them (uint8 stays 0..255). Arrays may be (n, H, W), (n, C, H, W),
or (n, H*W) with square images (else give --image-shape).

Output (in --out): labels.csv (each image's cluster and shape: the group of transformed copies
of one image it belongs to), alignments.csv (the rotation in degrees and shift in pixels that
move each image onto its cluster's center), centers.png, centers.npy, shapes.png (each
cluster's shapes by their invariant means), and metrics.json (ACC, ARI, NMI) when labels are
known."""

_FIT_EPILOG = """\
examples:
  invariant-cluster fit digits.npy --n-clusters 10 --max-rotation 60
  invariant-cluster fit data.npz --group se2 --max-translation 3 --out results/
  invariant-cluster fit copies.npy --max-translation 1 --center
  invariant-cluster fit t10k-images-idx3-ubyte.gz --labels t10k-labels-idx1-ubyte.gz \\
      --n-samples 500 --n-clusters 10 --max-rotation 60 --n-rotations 25
  invariant-cluster fit photos/ --group rotation --max-rotation 180 --device cuda
  invariant-cluster fit plankton/ --image-size 64 --invert --max-rotation 180

Options left out keep the defaults of invariant_cluster.InvariantAttentionClusterer (see
help(InvariantAttentionClusterer) in Python). The cost grows with n^2 x n-rotations x pixels:
on a CPU, start with a few hundred images; a GPU (--device cuda) takes thousands."""


_image_size = _number(int, 2, what="an integer >= 2")


def _add_input_options(p, default_out, *, labels=False):
    p.add_argument("input", metavar="INPUT",
                   help="an .mrcs/.mrc stack, a .npy/.npz file, an IDX file, or a folder of "
                        "PNG/JPEG images")
    if labels:
        p.add_argument("--labels", metavar="PATH",
                       help="true labels to score against (.npy, .npz, .csv/.txt or IDX)")
    p.add_argument("--image-shape", type=_positive_int, nargs="+", metavar="N",
                   help="H W (or C H W) to fold rows that are not square images")
    p.add_argument("--n-samples", type=_positive_int, metavar="N",
                   help="use only the first N images")
    p.add_argument("--stack", action="store_true",
                   help="read an MRC file's sections as images whatever its header says (a "
                        "stack saved as .mrc with a volume's header)")
    p.add_argument("--out", default=default_out, metavar="DIR",
                   help=f"output folder (default: ./{default_out})")


def _add_search_options(g):
    g.add_argument("--group", choices=["se2", "rotation", "translation", "none"],
                   help="transformations searched: se2 (rotations and shifts), rotation, "
                        "translation, or none (no alignment, the baseline)")
    g.add_argument("--max-rotation", type=_angle, metavar="DEG",
                   help="search rotations within +-DEG degrees (0..180)")
    g.add_argument("--n-rotations", type=_positive_int, metavar="R",
                   help="angles in the rotation grid (refined continuously afterwards)")
    g.add_argument("--max-translation", type=_nonnegative_float, metavar="PX",
                   help="search shifts within +-PX pixels")
    g.add_argument("--no-refine", dest="refine", action="store_false", default=None,
                   help="keep the grid's alignments (skip the continuous refinement)")
    g.add_argument("--reflection", action="store_true", default=None,
                   help="also search mirror images (O(2) instead of SO(2): cryo-EM views of "
                        "the two hands of a projection)")


def _add_running_options(p, *, seeded=True):
    r = p.add_argument_group("running")
    r.add_argument("--device", metavar="DEV",
                   help="auto (a GPU when there is one), cpu, cuda or cuda:N")
    r.add_argument("--batch-size", type=_positive_int, metavar="B",
                   help="block size of the alignment search (lower it if memory runs out)")
    if seeded:
        r.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
        r.add_argument("--verbose", "-v", action="count", default=0,
                       help="print the estimator's progress (per iteration)")
    r.add_argument("--quiet", "-q", action="store_true", help="no progress bar")


def _add_estimator_options(p):
    g = p.add_argument_group("clustering (InvariantAttentionClusterer's parameters)")
    g.add_argument("--n-clusters", type=_positive_int, metavar="K",
                   help="number of clusters; omit to let them emerge from the data")
    _add_search_options(g)
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
    g.add_argument("--noise-std", type=_noise_std, metavar="auto|SIGMA",
                   help="white noise damped before the search: 'auto' (measured on the images; "
                        "the default), its known standard deviation, or 0 for no filter")
    _add_running_options(p)


def _estimator_params(args, **fixed):
    """Only the options the user gave, so that the estimator's own defaults apply otherwise."""
    from .cluster import InvariantAttentionClusterer

    # class-averages pads its images to the centre's frame itself (--rotation-center)
    params = shared_options(vars(args), InvariantAttentionClusterer,
                            skip=("image_shape", "rotation_center"))
    params["random_state"] = args.seed
    # on a terminal the estimator's progress bars are on (stderr), unless --quiet
    params["verbose"] = max(args.verbose, int(not getattr(args, "quiet", False)
                                              and sys.stderr.isatty()))
    params.update(fixed)
    return params


_FIT_FILES = ("labels.csv", "alignments.csv", "centers.npy", "centers.png", "shapes.png",
              "metrics.json")


def _read_input(args, labels=None, stack=False):
    """``load_input`` of the command's input; with ``--stack`` (or ``stack``) an MRC file's
    sections are read as images whatever its header says."""
    from .datasets._files import MRC_SUFFIXES, load_input

    path = Path(args.input)
    stack = stack or getattr(args, "stack", False)
    if stack and path.suffix.lower() not in MRC_SUFFIXES:
        raise UsageError(f"--stack: reads an MRC file (.mrc, .mrcs), got {path}")
    return load_input(path, labels, args.image_shape, getattr(args, "image_size", None),
                      getattr(args, "invert", False), as_stack=stack)


def _load(args, labels=None):
    with _warnings_as_lines():
        X, y, names = _read_input(args, labels)
    if args.n_samples is not None:
        X = X[: args.n_samples]
        y = None if y is None else y[: args.n_samples]
        names = None if names is None else names[: args.n_samples]
    return X, y, names


def _fit(args, progress, X):
    """InvariantAttentionClusterer fitted with the options given; ``(est, seconds)``."""
    from .cluster import InvariantAttentionClusterer

    with progress.stage(f"fitting {len(X)} images"):
        est = InvariantAttentionClusterer(**_estimator_params(args))
        t0 = time.perf_counter()
        with _warnings_as_lines():
            est.fit(X)
        seconds = time.perf_counter() - t0
    _check_finite(invariant_means_=est.invariant_means_,
                  cluster_centers_=est.cluster_centers_)
    return est, seconds


def _report_clusters(est, X, seconds):
    sizes = [int((est.labels_ == c).sum()) for c in range(est.n_clusters_)]
    print(f"{len(X)} images -> {est.n_clusters_} clusters (sizes {sizes}) in {seconds:.1f} s, "
          f"{est.n_iter_} iterations")


def _cmd_fit(args):
    progress = StageBar(["load", "fit", "write"], args.quiet)
    try:
        with progress.stage("loading"):
            X, y, names = _load(args, args.labels)
        out = _check_out(args.out)
        est, seconds = _fit(args, progress, X)
        with progress.stage("writing"), _replacing(out, _FIT_FILES) as stage:
            _write_fit_outputs(stage, est, X, y, names, seconds, args)
    finally:
        progress.close()
    _report_clusters(est, X, seconds)
    if y is not None:
        from .metrics import clustering_scores

        s = clustering_scores(y, est.labels_)
        print(f"against the labels: ACC {s['ACC']:.3f}  ARI {s['ARI']:.3f}  NMI {s['NMI']:.3f}")
    print(f"wrote {out}/")
    return 0


_AVERAGES_DESCRIPTION = """\
Denoise a stack of images (e.g. cryo-EM particles): cluster them with invariant attention, as fit
does, and write each image's class average in its own pose: the invariant mean the image
converged to, a weighted average of its neighbours each aligned onto it (the estimator's
invariant_means_).

Input: as for fit, single-channel images: an MRC stack (.mrcs, or .mrc holding a stack; needs
pip install invariant_cluster[mrc]), .npy/.npz, IDX or a folder of PNG/JPEG.

With --one-step (implied by --denoise and --center), each image's class average is instead the
plain average of the image and its --n-neighbors (default 10) invariant nearest neighbours, each
aligned onto it, in one step (invariant_cluster.class_averages): no clustering, no
class_labels.csv.
--denoise C searches for those neighbours on a denoised copy (DihedralPCA with C components, or
'auto' for as many as stand above the noise, zoomed out to --denoise-size pixels) and averages
the original images; --center centres each copy on its centre of mass first, for particles
picked off-centre. On noisy particles this finds far better neighbours than the pixels (see
the README's cryo-EM benchmark).

With --star particles.star (RELION's, or cryoSPARC's .cs; one row per image): the search runs
on phase-flipped images, compared across --ctf-groups groups of similar defocus, and the
averages are CTF-corrected (Wiener, --snr), estimates of the projections without the CTF.
Without --one-step, class_averages.mrcs then holds one average per class (RELION's 2D classes)
instead of one per image. Rotations and mirrors are about pixel (W//2, H//2) for MRC
stacks and with --star (--rotation-center).

Output (in --out):
  class_averages.mrcs  (n, H, W) float32, image i's class average in image i's pose (with the
                       input's voxel size when it is an MRC file); with --star and clustering,
                       (n_classes, H, W), one per class
  class_labels.csv     the cluster of each image (not with --one-step)
  particles.star       with --star: its rows, and each particle's rlnClassNumber (1-based),
                       rlnIsFlip, rlnAnglePsi, rlnOriginXAngst, rlnOriginYAngst: mirrored,
                       turned and shifted as relion_stack_create --apply_transformation does,
                       the particle lies on its class average
  class_averages.json  parameters, seconds, environment"""

_AVERAGES_EPILOG = """\
examples:
  invariant-cluster class-averages particles.mrcs --max-translation 2 --out averages
  invariant-cluster class-averages particles.mrcs --n-samples 2000 --device cuda
  invariant-cluster class-averages particles.mrcs --reflection --n-rotations 72 \
      --max-translation 2 --denoise 40 --denoise-size 24 --center --out averages
  invariant-cluster class-averages particles.mrcs --star particles.star --n-clusters 50 \
      --reflection --n-rotations 72 --out classes

Options left out keep the defaults of invariant_cluster.InvariantAttentionClusterer."""

_AVERAGES_FILES = ("class_averages.mrcs", "class_labels.csv", "class_averages.json",
                   _cli_averages.STAR_OUT)


def _cmd_class_averages(args):
    import numpy as np

    from .datasets import mrc_voxel_size, save_mrc
    from .datasets._files import MRC_SUFFIXES
    from .datasets._mrc import import_mrcfile

    one_step, den = _cli_averages.one_step_options(args)
    progress = StageBar(["load", "fit", "write"], args.quiet)
    ctf = est = None
    try:
        with progress.stage("loading"), _warnings_as_lines():
            import_mrcfile()  # without mrcfile, say so before the fit
            path = Path(args.input)
            indices = None
            if args.star is not None:
                ctf, table, optics = _cli_averages.read_particles(args.star, args.pixel_size)
                indices = _cli_averages.named_indices(table, path)
            # rows naming N@INPUT say that INPUT is a stack, whatever its header says
            X, _, names = _read_input(args, None, stack=indices is not None
                                      and path.suffix.lower() in MRC_SUFFIXES)
            n_stack = len(X)
            X = X[: args.n_samples]
            names = None if names is None else names[: args.n_samples]
            if X.shape[1] != 1:
                raise UsageError(f"{args.input}: expected single-channel images for an MRC "
                                 f"stack, got {X.shape[1]} channels")
            voxel = mrc_voxel_size(path) if path.suffix.lower() in MRC_SUFFIXES else None
            centre = _cli_averages.resolve_rotation_center(args.rotation_center, path, args.star)
            if args.star is not None:
                ctf, table = _cli_averages.check_particles(args.star, ctf, table, indices,
                                                           n_stack, len(X), path)
        out = _check_out(args.out)
        if one_step:
            averages, seconds, method = _cli_averages.one_step_averages(
                args, progress, X, den, ctf, centre)
            labels, tau = np.arange(len(X)), np.zeros((len(X), 3))  # each its own, as it is
        elif ctf is not None:
            averages, labels, tau, est, seconds = _cli_averages.cluster_ctf_averages(
                args, progress, X, ctf, centre, _fit)
            method = {"method": "CTF-corrected class averages", "n_clusters": len(averages)}
        else:
            est, seconds = _fit(args, progress, _cli_averages.padded(X, centre))
            frame = _cli_averages.padded(X[:1], centre).shape[2:]  # fitted in the centre's frame
            averages = est.invariant_means_.reshape(len(X), *frame)[
                :, :X.shape[-2], :X.shape[-1]]
            method = {"method": "invariant_means_"}
        if est is not None:
            method |= {"n_clusters": int(est.n_clusters_), "n_iter": int(est.n_iter_),
                       "params": est.get_params(deep=False) | {"device": str(est.device)}}
        method |= {"rotation_center": centre, "star": None if ctf is None else str(args.star)}
        with progress.stage("writing"), _replacing(out, _AVERAGES_FILES) as stage:
            save_mrc(stage / "class_averages.mrcs",
                     averages.reshape(len(averages), *X.shape[2:]), voxel)
            if est is not None:
                _write_labels(stage, est.labels_, None, names, "class_labels.csv")
            if ctf is not None:
                _cli_averages.write_results(stage, table, optics, labels, tau, ctf)
            info = {"input": str(args.input), "n_images": len(X),
                    "image_shape": list(X.shape[2:]), "voxel_size": voxel, **method,
                    "seconds": seconds, "environment": _environment()}
            (stage / "class_averages.json").write_text(
                json.dumps(info, indent=2, default=str) + "\n")
    finally:
        progress.close()
    if est is not None:
        _report_clusters(est, X, seconds)
    else:
        print(f"{len(X)} images averaged with their {method['n_neighbors']} neighbours in "
              f"{seconds:.1f} s")
    print(f"wrote {out / 'class_averages.mrcs'} ({len(averages)} class averages)")
    if ctf is not None:
        print(f"wrote {out / _cli_averages.STAR_OUT}")
    return 0


def _write_fit_outputs(out, est, X, y, names, seconds, args):
    import numpy as np

    from .plotting import plot_invariant_means, plot_shapes

    ids, id_col = _write_labels(out, est.labels_, y, names, shapes=est.shape_labels_)
    labels = est.labels_
    a = est.alignments_
    # with --reflection a 4th column: 1 where the image is mirrored onto its cluster's mean
    mirror = ["mirrored"] if a.shape[1] > 3 else []
    _write_csv(out / "alignments.csv", [id_col, "label", "angle_deg", "tx_px", "ty_px", *mirror],
               [[ids[i], int(labels[i]), f"{a[i, 0]:.4f}", f"{a[i, 1]:.4f}", f"{a[i, 2]:.4f}",
                 *([str(int(round(a[i, 3])))] if mirror else [])] for i in range(len(X))])
    np.save(out / "centers.npy", est.cluster_centers_.reshape(-1, *est.image_shape_))
    _save_figure(plot_invariant_means(est, max_clusters=50), out / "centers.png")
    _save_figure(plot_shapes(est, max_clusters=20), out / "shapes.png")
    if y is not None:
        from .metrics import clustering_scores

        params = {k: (v if isinstance(v, (int, float, str, bool, type(None))) else str(v))
                  for k, v in est.get_params().items()}
        report = {
            "input": str(args.input),
            "n_samples": int(len(X)),
            "n_clusters": int(est.n_clusters_),
            "n_shapes": int(est.n_shapes_),
            "count_rule": est.count_rule_,
            "n_classes": int(len(np.unique(y))),
            **clustering_scores(y, labels),
            "seconds": seconds,
            "n_iter": int(est.n_iter_),
            "params": params,
            "environment": _environment(),
        }
        (out / "metrics.json").write_text(json.dumps(report, indent=2) + "\n")


# ---------------------------------------------------------------------------------------------
# demo
# ---------------------------------------------------------------------------------------------

_DEMO_DESCRIPTION = """\
Cluster randomly rotated handwritten digits three ways and compare them with the true digits:
k-means on the pixels, kernel attention (attention without alignment, the baseline) and
invariant attention (attention that aligns images before comparing them).

Works offline on scikit-learn's bundled 8x8 digits; with --data, on the MNIST test split
(28x28). Prints ACC (accuracy under the best matching of clusters to digits), ARI, NMI and the
seconds each method took, and writes invariant_means.png and demo.json to --out."""

_DEMO_EPILOG = """\
examples:
  invariant-cluster demo
  invariant-cluster demo --max-rotation 90 --n-samples 300 --out /tmp/demo
  invariant-cluster demo --data ~/mnist --n-samples 300 --device cuda
  python -m invariant_cluster demo --n-samples 60       # a few seconds

The invariant search covers +-(max-rotation + 15) degrees (up to 180), at about 5 degree
steps unless --n-rotations says otherwise."""

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


_NEIGHBORS_FILES = ("graph.npz", "indices.npy", "distances.npy", "alignments.npy",
                    "neighbors.json")


def _cmd_neighbors(args):
    import numpy as np
    from scipy import sparse

    progress = StageBar(["load", "search", "write"], args.quiet)
    try:
        with progress.stage("loading"):
            X, _, _ = _load(args)
        if args.n_neighbors >= len(X):
            raise UsageError(f"--n-neighbors: expected fewer than the {len(X)} images, got "
                             f"{args.n_neighbors}")
        out = _check_out(args.out)
        with progress.stage(f"searching the neighbours of {len(X)} images"):
            from .kneighbors import InvariantKNeighborsTransformer, csr_graph

            est = InvariantKNeighborsTransformer(**shared_options(
                vars(args), InvariantKNeighborsTransformer, skip=("image_shape",)))
            t0 = time.perf_counter()
            with _warnings_as_lines():
                est.fit(X)
                dist, ind, tau = est.kneighbors(X, n_neighbors=args.n_neighbors + 1,
                                                return_alignments=True)
            seconds = time.perf_counter() - t0
        _check_finite(distances=dist, alignments=tau)
        with progress.stage("writing"), _replacing(out, _NEIGHBORS_FILES) as stage:
            sparse.save_npz(stage / "graph.npz", csr_graph(dist, ind, len(X)))
            np.save(stage / "indices.npy", ind)
            np.save(stage / "distances.npy", dist)
            np.save(stage / "alignments.npy", tau)
            info = {"input": str(args.input), "n_images": len(X),
                    "image_shape": list(est.image_shape_), "n_neighbors": args.n_neighbors,
                    "params": est.get_params(deep=False) | {"client": None,
                                                           "device": str(est.device)},
                    "seconds": seconds, "environment": _environment()}
            (stage / "neighbors.json").write_text(json.dumps(info, indent=2, default=str) + "\n")
    finally:
        progress.close()
    print(f"{len(X)} images -> invariant {args.n_neighbors}-NN graph in {seconds:.1f} s; "
          f"median distance to the nearest other image {float(np.median(dist[:, 1])):.3g}")
    print(f"wrote {out}/")
    return 0


def _command(sub, name, func, help, description, epilog):
    p = sub.add_parser(name, help=help, description=description, epilog=epilog,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.set_defaults(func=func)
    return p


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
               "  invariant-cluster neighbors images.npy --n-neighbors 15 --out knn\n"
               "  invariant-cluster class-averages particles.mrcs --out averages\n"
               "\nNo two commands write a file of the same name: each replaces only its own "
               "files\nof an earlier run in --out, and a run that fails leaves --out as it was.\n",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True,
                           parser_class=_Parser)

    d = _command(sub, "demo", _cli_demo.run, "compare k-means, kernel and invariant attention on "
                 "rotated digits (offline)", _DEMO_DESCRIPTION, _DEMO_EPILOG)
    d.add_argument("--data", metavar="PATH",
                   help="folder holding the MNIST test split (t10k-*-ubyte[.gz]); default: "
                        "scikit-learn's bundled digits, no download")
    d.add_argument("--n-samples", type=_positive_int, metavar="N",
                   help=f"images to cluster (default: {_cli_demo.N_DIGITS} digits, "
                        f"{_cli_demo.N_MNIST} with --data)")
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

    f = _command(sub, "fit", _cmd_fit, "cluster your own images (.npy/.npz, .mrcs, IDX, or a "
                 "folder of images)", _FIT_DESCRIPTION, _FIT_EPILOG)
    _add_input_options(f, "invariant_cluster_out", labels=True)
    f.add_argument("--image-size", type=_image_size, metavar="N",
                   help="for a folder of images of different sizes: scale each one's longest "
                        "side to N and centre it on an N x N canvas of its background's value "
                        "(values then in [0, 1])")
    f.add_argument("--invert", action="store_true",
                   help="for a folder: dark objects on a light background, inverted to "
                        "bright objects on a dark one")
    _add_estimator_options(f)
    f.add_argument("--center", action="store_true", default=None,
                   help="centre every image on its centre of mass before the search, for "
                        "shapes that move on an empty background (copies shifted within +-S "
                        "px differ by up to 2.4 S px, beyond --max-translation S); without it "
                        "the estimator's center='auto' decides from the images")

    ca = _command(sub, "class-averages", _cmd_class_averages, "each image's class average in "
                  "its own pose, written as an MRC stack (.mrcs)", _AVERAGES_DESCRIPTION,
                  _AVERAGES_EPILOG)
    _add_input_options(ca, "invariant_cluster_class_averages")
    _add_estimator_options(ca)
    o = ca.add_argument_group("one-step class averages (class_averages: no clustering)")
    o.add_argument("--one-step", action="store_true",
                   help="average each image with its --n-neighbors (default 10) aligned "
                        "neighbours, in one step, instead of fitting the clusterer")
    o.add_argument("--denoise", type=_components, metavar="C",
                   help="search the neighbours on a DihedralPCA copy with C components, or "
                        "'auto': those above the noise's hard threshold (implies "
                        "--one-step; the original images are averaged)")
    o.add_argument("--denoise-size", type=_positive_int, metavar="PX",
                   help="zoom the copy out to PX x PX pixels first (with --denoise)")
    o.add_argument("--center", action="store_true",
                   help="centre each (denoised) image on its centre of mass before the search "
                        "(implies --one-step): for particles picked off-centre")
    _cli_averages.add_cryoem_options(ca)

    nb = _command(sub, "neighbors", _cmd_neighbors, "the invariant k-nearest-neighbour graph "
                  "of your images (graph.npz + alignments)", _NEIGHBORS_DESCRIPTION,
                  _NEIGHBORS_EPILOG)
    _add_input_options(nb, "invariant_cluster_neighbors")
    nb.add_argument("--n-neighbors", type=_positive_int, default=5, metavar="K",
                    help="neighbours per image, besides itself (default: 5)")
    g = nb.add_argument_group("search (InvariantKNeighborsTransformer's parameters)")
    _add_search_options(g)
    g.add_argument("--neighbor-search", choices=["auto", "exact", "shortlist"],
                   help="exact, descriptor shortlist, or auto (default: exact up to 4000 "
                        "images with 36 angles)")
    g.add_argument("--n-candidates", type=_positive_int, metavar="C",
                   help="shortlist length per image")
    _add_running_options(nb, seeded=False)
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
    except (UsageError, ValueError, TypeError, OSError, KeyError, ImportError) as exc:
        print(f"{cmd}: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except (RuntimeError, MemoryError) as exc:
        print(f"{cmd}: failed: {_one_line(exc)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
