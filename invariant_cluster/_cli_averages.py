"""The work of ``class-averages`` beyond the clusterer's fit: the one-step averages, and with
``--star`` the particles' CTF from a RELION STAR file or a cryoSPARC ``.cs`` file, the
CTF-corrected averages and the STAR file of the results (kept apart from ``cli.py``, which
stays a parser)."""

from __future__ import annotations

import time
from pathlib import Path

from ._cli_support import (
    UsageError,
    _check_finite,
    _number,
    _positive_int,
    _warnings_as_lines,
    shared_options,
)

STAR_OUT = "particles.star"
# the result columns written after the input's: class, then RELION's in-plane transformation
# of the particle onto its class average (mirrored first where rlnIsFlip is 1)
RESULT_COLUMNS = ("rlnClassNumber", "rlnAnglePsi", "rlnOriginXAngst", "rlnOriginYAngst",
                  "rlnIsFlip")


_PIXEL_SIZE = _number(float, 0, strict=True, what="a positive number (ångström)")


def add_cryoem_options(parser):
    """``--star``, ``--pixel-size``, ``--snr`` and ``--rotation-center``."""
    c = parser.add_argument_group("cryo-EM: the CTF and the rotation centre")
    c.add_argument("--star", metavar="PATH",
                   help="RELION STAR file of the particles, or cryoSPARC's .cs file (one row "
                        "per image of the stack, in its order; needs pip install "
                        "invariant_cluster[cryoem]): the search on phase-flipped images "
                        "compared across CTF groups, CTF-corrected averages, and "
                        "particles.star with each particle's class, angle, shift and mirror. "
                        "Rows naming their image N@INPUT (rlnImageName; a .cs file's blob/idx "
                        "and blob/path) must name images 1, 2, ... in order, and make a .mrc "
                        "INPUT read as a stack (--stack)")
    c.add_argument("--pixel-size", type=_PIXEL_SIZE, metavar="A",
                   help="with --star, the pixel size in ångström instead of the file's "
                        "(needed where the file has none)")
    c.add_argument("--ctf-groups", type=_positive_int, default=None, metavar="G",
                   help="with --star, the one-step search compares images across at most G "
                        "groups of similar defocus, each pair filtered to the same CTF "
                        "(default: invariant_cluster.ctf.CTF_GROUPS; 1: phase-flipped images "
                        "only)")
    positive = _number(float, 0, strict=True, what="'auto' or a positive number")
    c.add_argument("--snr", type=lambda t: t if t == "auto" else positive(t), metavar="SNR",
                   help="Wiener-filtered averages: the signal-to-noise ratio of one image, or "
                        "'auto' to measure the noise (default: auto with --star, else plain "
                        "averages)")
    c.add_argument("--steerable-filter", action="store_true",
                   help="no --star or --snr: the plain means of k + 1 images filtered by the "
                        "covariance Wiener filter in a Fourier-Bessel basis (SteerableWiener) "
                        "at the measured noise / sqrt(k + 1), blended with each image "
                        "filtered alone by the weight a risk estimate on the data prefers "
                        "(steerable_class_averages)")
    c.add_argument("--rotation-center", choices=["auto", "geometric", "fourier"],
                   default="auto",
                   help="centre of rotations and mirrors: 'fourier' is pixel (W//2, H//2) "
                        "(RELION's), 'geometric' ((W-1)/2, (H-1)/2); auto (default): fourier "
                        "for an MRC stack or with --star, else geometric")


def one_step_options(args):
    """``(one_step, denoiser)`` from the class-averages options (UsageError when they clash)."""
    if args.denoise_size is not None and args.denoise is None:
        raise UsageError("--denoise-size: only with --denoise")
    if args.pixel_size is not None and args.star is None:
        raise UsageError("--pixel-size: only with --star")
    one_step = bool(args.one_step or args.denoise is not None or args.center)
    if args.steerable_filter:
        if not one_step:
            raise UsageError("--steerable-filter: only with the one-step averages (--one-step, "
                             "--denoise or --center)")
        if args.star is not None or args.snr is not None:
            raise UsageError("--steerable-filter: filters plain means (white noise); not with "
                             "--star or --snr")
    if one_step:
        clash = [f"--{n.replace('_', '-')}" for n in ("n_clusters", "bandwidth", "update",
                                                      "max_iter", "tol")
                 if getattr(args, n) is not None]
        if clash:
            raise UsageError(f"{', '.join(clash)}: options of the clustering, not of the "
                             f"one-step average (--one-step, --denoise, --center)")
    den = None
    if args.denoise is not None:
        from .denoise import DihedralPCA

        den = DihedralPCA(args.denoise, output_size=args.denoise_size)
    return one_step, den


def one_step_averages(args, progress, X, den, ctf=None, rotation_center="geometric"):
    """:func:`~invariant_cluster.class_averages` with the options given; ``(averages,
    seconds)``."""
    from .barycenters import class_averages
    from .ctf import CTF_GROUPS
    from .kneighbors import InvariantKNeighborsTransformer

    # the search's options: what class_averages shares with the kNN transformer
    params = shared_options(vars(args), InvariantKNeighborsTransformer, class_averages,
                            skip=("image_shape", "n_neighbors", "center", "rotation_center"))
    k = 10 if args.n_neighbors is None else args.n_neighbors
    if den is not None and args.denoise_size is not None:
        h, w = X.shape[-2:]
        if h != w:
            raise UsageError(f"--denoise-size: zooms square images out, got {h} x {w} images")
        if args.denoise_size > h:  # before the search pads them to the centre's frame
            raise UsageError(f"--denoise-size: expected at most the image size {h}, got "
                             f"{args.denoise_size}")
    if k >= len(X):
        raise UsageError(f"--n-neighbors: expected at most {len(X) - 1} for {len(X)} images, "
                         f"got {k}")
    choice = None
    groups = CTF_GROUPS if args.ctf_groups is None else args.ctf_groups
    with progress.stage(f"averaging {len(X)} images with their {k} neighbours"):
        t0 = time.perf_counter()
        with _warnings_as_lines():
            if args.steerable_filter:
                from .steerable import steerable_class_averages

                averages, choice = steerable_class_averages(
                    X, n_neighbors=k, denoise=den, center=args.center,
                    rotation_center=rotation_center, return_choice=True, **params)
            else:
                averages = class_averages(X, n_neighbors=k, denoise=den, center=args.center,
                                          ctf=ctf, ctf_groups=groups, snr=args.snr,
                                          rotation_center=rotation_center, **params)
        seconds = time.perf_counter() - t0
    _check_finite(class_averages=averages)
    info = {"method": "one-step", "n_neighbors": k,
            "steerable_filter": choice,
            "denoise": None if den is None else den.get_params(), "center": bool(args.center),
            "ctf": ctf is not None, "ctf_groups": groups if ctf is not None else None,
            "snr": args.snr,
            "rotation_center": rotation_center, "params": params}
    return averages, seconds, info


def resolve_rotation_center(choice, input_path, star) -> str:
    """``--rotation-center``: ``auto`` is the field's ``fourier`` for an MRC stack or with
    ``--star``, else ``geometric``."""
    from .datasets._files import MRC_SUFFIXES

    if choice != "auto":
        return choice
    mrc = Path(input_path).suffix.lower() in MRC_SUFFIXES
    return "fourier" if (mrc or star is not None) else "geometric"


def read_particles(path, pixel_size=None):
    """``(ctf, table, optics)`` of every particle of ``--star``: a cryoSPARC ``.cs`` file by its
    suffix, else a STAR file."""
    from .ctf import _read_star, read_cs

    try:
        if Path(path).suffix.lower() == ".cs":
            ctf, table = read_cs(path, pixel_size=pixel_size)
            optics = None
        else:
            ctf, table, optics = _read_star(path, None, pixel_size)
    except (ValueError, TypeError, OSError) as exc:
        raise UsageError(f"--star {exc}") from None
    return ctf, table, optics


def named_indices(table, input_path):
    """The 1-based image numbers of the rows' ``rlnImageName`` (``N@file``) when every row names
    an image of ``input_path`` (by file name), else None."""
    if "rlnImageName" not in table:
        return None
    name = Path(input_path).name
    numbers = []
    for ref in table["rlnImageName"].astype(str):
        index, at, file = ref.partition("@")
        if not at or Path(file.strip()).name != name or not index.strip().isdigit():
            return None
        numbers.append(int(index))
    return numbers


def check_particles(path, ctf, table, indices, n_stack, n, input_path):
    """The first ``n`` particles of a file that must describe all ``n_stack`` images of the stack
    (one row each, in its order): ``(ctf, table)``."""
    if len(table) != n_stack:
        raise UsageError(f"--star {path}: has {len(table)} particle rows, expected {n_stack} "
                         f"(one per image of the stack {input_path})")
    if indices is not None:
        wrong = next((i for i, k in enumerate(indices) if k != i + 1), None)
        if wrong is not None:
            raise UsageError(f"--star {path}: row {wrong + 1} names image {indices[wrong]} of "
                             f"{Path(input_path).name}, expected image {wrong + 1} (one row "
                             "per image of the stack, in its order)")
    return ctf[:n], table.iloc[:n].reset_index(drop=True)


def padded(X, rotation_center):
    """Images ``(n, C, H, W)`` with the zero rows and columns of
    :func:`~invariant_cluster.transforms.centre_padding` appended."""
    import numpy as np

    from .transforms import centre_padding

    ph, pw = centre_padding(X.shape[-2], X.shape[-1], rotation_center)
    return np.pad(X, ((0, 0), (0, 0), (0, ph), (0, pw))) if ph or pw else X


def cluster_ctf_averages(args, progress, X, ctf, rotation_center, fit):
    """The clusterer fitted on the phase-flipped images (in the centre's frame), then each
    cluster's CTF-corrected average: ``(averages (K, H, W), labels, alignments (n, 3 or 4),
    est, seconds)``."""
    import numpy as np

    from .barycenters import class_averages
    from .ctf import phase_flip

    t0 = time.perf_counter()
    flipped = phase_flip(X[:, 0], ctf)[:, None].astype(np.float32)
    est, _ = fit(args, progress, padded(flipped, rotation_center))
    from .kneighbors import InvariantKNeighborsTransformer

    search = shared_options(est.get_params(deep=False), InvariantKNeighborsTransformer,
                            class_averages,
                            skip=("image_shape", "n_neighbors", "device", "center",
                                  "rotation_center"))
    with progress.stage(f"CTF-corrected averages of {est.n_clusters_} classes"), \
            _warnings_as_lines():
        averages, tau = class_averages(X, labels=est.labels_, ctf=ctf, snr=args.snr,
                                       rotation_center=rotation_center, device=est.device,
                                       return_alignments=True, **search)
    return averages[:, 0], est.labels_, tau, est, time.perf_counter() - t0


def results_table(table, labels, tau, pixel_size):
    """The input's particles table with :data:`RESULT_COLUMNS` (replacing columns of those
    names): class ``labels + 1``, and the alignment ``tau`` (which maps the particle onto its
    class average) in RELION's convention, the one ``relion_stack_create
    --apply_transformation`` applies to align particles: the particle, mirrored first where
    ``rlnIsFlip`` is 1 (``x -> -x`` about the pixel ``(W // 2, H // 2)``), then rotated by
    ``rlnAnglePsi`` (RELION's ``rotation2DMatrix``: clockwise as displayed, this package's
    ``-angle``) about that pixel and shifted by ``rlnOrigin*Angst`` (this package's ``t``, in
    ångström), lies on its class average."""
    import numpy as np

    from .transforms import wrap_degrees

    out = table.copy()
    tau = np.asarray(tau, dtype=np.float64)
    if tau.shape[1] == 3:
        tau = np.concatenate([tau, np.zeros((len(tau), 1))], 1)
    values = [np.asarray(labels) + 1, wrap_degrees(-tau[:, 0]), tau[:, 1] * pixel_size,
              tau[:, 2] * pixel_size, tau[:, 3].round().astype(int)]
    for name, v in zip(RESULT_COLUMNS, values):
        out[name] = v
    return out


def write_results(out, table, optics, labels, tau, ctf):
    from .ctf import write_star

    write_star(Path(out) / STAR_OUT, results_table(table, labels, tau, ctf.pixel_size),
               optics=optics)
