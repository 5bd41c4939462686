"""Cryo-EM 2D classification against ASPIRE, on ASPIRE's own simulated projections.

The field's Python library is ASPIRE. Its ``RIRClass2D`` (bispectrum of steerable-PCA
coefficients, nearest neighbours, reflections allowed) finds each image's neighbours in viewing
direction, and an aligning averager (``BFTAverager2D``: brute-force shifts of +-L/32 px, polar
cross-correlation over 360 angles, reflections applied) averages them into class averages.
This benchmark runs both on the same images, and ours:

- ``knn``: :class:`~invariant_cluster.InvariantKNeighborsTransformer` (72 angles over the full
  circle, ``max_translation`` = the data's shift range; refinement with ``--refine``, off by
  default: on this 2-core machine it took 10 times the grid search), ``kneighbors`` with the
  alignments;
- ``one-step``: each image and its k invariant nearest neighbours, each warped onto the image by
  the returned alignment, averaged (one step, no iteration);
- ``means``: ``InvariantAttentionClusterer(n_rotations=72, max_translation=...)`` fitted on the
  images, its ``invariant_means_`` (each image's converged mean, in its own pose).

``--methods`` picks among ``knn``, ``knn-mirror``, ``knn-mirror-blur``, ``knn-mirror-pca``,
``knn-mirror-pca-center``, ``means``, ``means-mirror`` and ``means-mirror-search``: ``-mirror`` is
``reflection=True`` (the search also covers mirror images, as ASPIRE's does); ``-blur`` searches on
Gaussian-blurred copies (``--blur`` px), a low-pass like the steerable-PCA truncation before
ASPIRE's bispectrum, and averages the noisy images with the alignments found there; ``-pca`` does
the same on :class:`~invariant_cluster.denoise.DihedralPCA` (``--pca-components``, ``--pca-size``),
what ``class_averages(denoise=...)`` runs; ``-center`` centres each denoised copy on its centre of
mass first (``center=True``); ``-search`` runs the kNN search again on the fitted invariant means
(denoised images) and scores those neighbours (their seconds include the fit).

Data (part ``aspire``, run under the ASPIRE environment): ``aspire.source.Simulation`` of one
``aspire.volume.AsymmetricVolume`` (L = 64, seed 0), ``--n`` images (2,000), no CTF, amplitudes 1,
white noise from ``WhiteNoiseAdder.from_snr`` at SNR 4, 1, 1/4, 1/16, and offsets either 0 or
uniform in +-2 px. The noisy images, the CLEAN images (same pose and offset, no noise) and the
rotations are written to an ``.npz`` per setting in ``--workdir`` (default
``$TMPDIR/invariant_cluster_cryoem``; never committed), with ASPIRE's neighbours, reflections,
class averages and seconds.

Measures, per method:

- ``nbr10``: the share of the 10 nearest neighbours (self excluded) within 10 degrees of the
  query's viewing direction, and ``med_angle`` the median angle over those pairs. The viewing
  direction of image i is the third column of ASPIRE's ``rotations[i]`` (checked: an in-plane
  rotation of the projection leaves it unchanged). Mirrors: the projection from ``-v`` is the
  mirror image of the projection from ``v``, so for a pair that the METHOD reports as mirrored
  (ASPIRE's ``reflections`` flag; our mirror bit once ``reflection=True`` exists) the angle is
  between ``v_i`` and ``-v_j``; for a pair reported unmirrored it is between ``v_i`` and ``v_j``.
  A method is thus credited only for the relation it claims. Chance level (uniform directions):
  ``1 - cos(10 deg)`` = 0.015 without mirrors, twice that with.
- Centres: ASPIRE centres its images at pixel ``(L/2, L/2)``, this package at
  ``((L-1)/2, (L-1)/2)``; for an even L, ours are given, and every method is scored on, the
  ``(L-1) x (L-1)`` crop without the first row and column, whose centre is ASPIRE's (see the
  maintenance note in ``ours_part``).
- ``corr_detail``: the same correlation once the mean of all clean images is subtracted from
  both images (the particle's common shape: the plain mean of all noisy images, unaligned,
  correlates about 0.94 with every clean projection, so ``corr`` alone rewards blurring);
  ``mean of all noisy images`` is that baseline's row.
- ``corr``: the median Pearson correlation, over ``--n-avg`` images (the first ones; ASPIRE's
  averager is the slow part), of each image's class average with its clean image. ASPIRE's
  class average of class i is in the pose of its reference image i, as ours are.
  ``noisy``: the noisy image itself.
- ``seconds``: wall time of the neighbour search (ASPIRE: ``classify``, i.e. steerable PCA,
  bispectrum and nearest neighbours of all n images; ours: ``kneighbors`` of all n) and of the
  class averages (ASPIRE: the averager on ``--n-avg`` classes, also extrapolated to all n; ours:
  the one-step average of all n; ``means``: the whole ``fit``). All with ``--threads`` threads
  (1 by default) on the same machine, one job at a time.

Install ASPIRE in its own virtual environment (it pins its own numpy/scipy; CI does not need
it)::

    python -m venv /work/aspire-venv && /work/aspire-venv/bin/pip install aspire

Commands::

    python benchmarks/bench_cryoem.py --aspire-python /work/aspire-venv/bin/python
    ASPIRE_PYTHON=/work/aspire-venv/bin/python python benchmarks/bench_cryoem.py --quick
    python benchmarks/bench_cryoem.py --snr 1 --shift 0 --skip-aspire   # reuse the .npz

Writes the run ``default`` of ``benchmarks/results/cryoem.json`` (``quick`` with ``--quick``;
``--run`` names another).

The CTF suite (``--suite ctf``, run ``ctf`` of ``benchmarks/results/cryoem.json``) compares,
on the full ``L x L`` images (no crop) with and without a CTF (``--ctf no yes``):

- data: the same volume; with CTF, 7 defocus groups from 1.5 to 2.5 um (ASPIRE's
  ``RadialCTFFilter``, 200 kV, Cs 2.0 mm, amplitude contrast 0.1, pixel 5 A); offsets of 0 or
  uniform within +-``--ctf-shift`` px (then ours search shifts within that range, each copy
  centred first: ``max_translation``, ``center=True``); every score is against the projections
  WITHOUT the CTF (``Simulation.projections``, shifted as the images are);
- ASPIRE: ``DenoiserCov2D`` (covariance Wiener filter on an ``FFBBasis2D``, given the true
  noise variance; no alignment), and ``RIRClass2D``'s neighbours (on ASPIRE's phase-flipped
  images when there is a CTF);
- ours: ``class_averages`` (72 angles, mirrors, the search on ``DihedralPCA(40,
  output_size=24)``, ``rotation_center="fourier"``, and ``"geometric"`` for comparison; with a
  CTF the images compared across the default number of CTF groups, ``ctf_groups``, and for
  the before / after on the phase-flipped images alone, ``ctf_groups=1``, with 2 and 8 groups
  on ``DihedralPCA("auto", output_size=32)``), each image's one-step average of k = 10
  neighbours: the Wiener estimate with the noise measured
  (``snr="auto"``; CTF-corrected when there is a CTF), with the true SNR (with CTF), or the
  plain mean (without); and our filter alone as a control (``RadialWiener``
  without CTF, ``ctf.wiener_filter`` with ``ctf.spectral_snr`` with it). ASPIRE's images have
  the raw micrograph's contrast (dark protein); ours get ``-images``, as RELION's extraction
  (``--invert_contrast``) writes particles;
- ``rel_mse``: ``||A - P||^2 / ||P||^2`` of an average ``A`` against the projection ``P``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

K_METRIC = 10
ANGLE_DEG = 10.0


def _tag(snr, shift, n):
    return f"snr{snr:g}_shift{shift:g}_n{n}"


# --------------------------------------------------------------------------- part (a): ASPIRE
def aspire_part(args):
    """Simulate, classify and average with ASPIRE; write everything to one .npz."""
    import aspire
    from aspire.classification import BFTAverager2D, RIRClass2D
    from aspire.noise import WhiteNoiseAdder
    from aspire.source import ArrayImageSource, Simulation
    from aspire.volume import AsymmetricVolume

    L, n = args.L, args.n
    vol = AsymmetricVolume(L=L, C=1, seed=0, dtype=np.float64).generate()
    rng = np.random.default_rng(1)
    offsets = rng.uniform(-args.shift, args.shift, (n, 2)) if args.shift > 0 else 0
    sim = Simulation(L=L, n=n, vols=vol, offsets=offsets, amplitudes=1, seed=0,
                     dtype=np.float64,
                     noise_adder=WhiteNoiseAdder.from_snr(args.snr, seed=2))
    noisy = sim.images[:].asnumpy().astype(np.float32)
    clean = sim.clean_images[:].asnumpy().astype(np.float32)
    rots = np.asarray(sim.rotations, dtype=np.float64)
    # a fixed array source: the classifier and the averager read exactly the saved images
    src = ArrayImageSource(noisy.astype(np.float64), pixel_size=sim.pixel_size)

    t0 = time.perf_counter()
    clf = RIRClass2D(src, fspca_components=400, bispectrum_components=300,
                     n_nbor=args.k + 1, large_pca_implementation="legacy",
                     nn_implementation="legacy", bispectrum_implementation="legacy", seed=0)
    classes, refl, dist = clf.classify()
    t_classify = time.perf_counter() - t0

    m = min(args.n_avg, n)
    t0 = time.perf_counter()
    averager = BFTAverager2D(clf.pca_basis.basis, src, dtype=np.float64)
    avgs = averager.average(classes[:m], refl[:m]).asnumpy().astype(np.float32)
    t_avg = time.perf_counter() - t0

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez(out, noisy=noisy, clean=clean, rotations=rots,
             offsets=np.broadcast_to(np.asarray(offsets, dtype=np.float64), (n, 2)),
             classes=np.asarray(classes), reflections=np.asarray(refl, dtype=bool),
             distances=np.asarray(dist), averages=avgs,
             seconds_classify=t_classify, seconds_average=t_avg, n_avg=m,
             aspire_version=aspire.__version__, snr=args.snr, shift=args.shift)
    print(f"ASPIRE {aspire.__version__}: classify {t_classify:.1f} s, averages of {m} "
          f"classes {t_avg:.1f} s -> {out}", flush=True)


# --------------------------------------------------------------------------- metrics
def viewing_directions(rots):
    """Third column of each rotation: invariant under in-plane rotations of the projection."""
    return rots[:, :, 2]


def neighbour_angles(rots, ind, mirrored=None):
    """Angle in degrees between each query's viewing direction and each neighbour's.

    A neighbour reported as mirrored is compared with the opposite direction (its projection is
    the mirror image of the projection from ``-v``).
    """
    v = viewing_directions(rots)
    dots = np.einsum("id,ikd->ik", v, v[ind])
    if mirrored is not None:
        dots = np.where(mirrored, -dots, dots)
    return np.degrees(np.arccos(np.clip(dots, -1.0, 1.0)))


def neighbour_scores(rots, ind, mirrored=None):
    ang = neighbour_angles(rots, ind[:, :K_METRIC],
                           None if mirrored is None else mirrored[:, :K_METRIC])
    return {"nbr10": float(np.mean(ang <= ANGLE_DEG)), "med_angle": float(np.median(ang))}


def correlations(A, B):
    """Pearson correlation of each pair of images (rows)."""
    a = A.reshape(len(A), -1).astype(np.float64)
    b = B.reshape(len(B), -1).astype(np.float64)
    a = a - a.mean(1, keepdims=True)
    b = b - b.mean(1, keepdims=True)
    return (a * b).sum(1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1),
                                       1e-30)


def average_scores(A, clean, m, blob):
    """``corr``: median correlation of the first ``m`` averages with their clean images;
    ``corr_detail``: the same once the mean of ALL clean images (``blob``) is subtracted from
    both, i.e. how much of what distinguishes the image's view the average recovers."""
    return {"corr": float(np.median(correlations(A[:m], clean[:m]))),
            "corr_detail": float(np.median(correlations(A[:m] - blob, clean[:m] - blob)))}


# --------------------------------------------------------------------------- part (b): ours
def one_step_average(X, ind, tau, k):
    """Each image and its ``k`` nearest neighbours warped onto it, averaged with equal weights
    (the image itself at the identity): what ``barycenters.class_averages`` runs after its
    search."""
    import torch

    from invariant_cluster.barycenters import _one_step_average

    n = X.shape[0]
    Xt = torch.as_tensor(X).reshape(n, -1, *X.shape[-2:])  # (n, C, H, W)
    return _one_step_average(Xt, ind[:, :k], tau[:, :k]).numpy().reshape(n, *X.shape[1:])


def ours_part(data, args):
    from invariant_cluster import (
        InvariantAttentionClusterer,
        InvariantKNeighborsTransformer,
        aligned_neighbors,
    )

    # Maintenance note: ASPIRE's images are centred at pixel (L/2, L/2), ours (the rotation
    # centre and the mirror axis of invariant_cluster.transforms) at ((L-1)/2, (L-1)/2). For an
    # even L every rotation about the wrong centre is also a shift of up to 0.7 px: a quarter
    # turn of a clean ASPIRE projection then differs from the projection turned by 90 degrees
    # by 11% of its peak, and by 0 (round-off) once the first row and column are dropped. So
    # ours are given, and every method is scored on, that (L-1) x (L-1) crop, whose centre is
    # ASPIRE's (ASPIRE itself runs on the full images, in its own convention).
    even = data["noisy"].shape[-1] % 2 == 0
    crop = (slice(None), slice(1, None), slice(1, None)) if even else ...
    X = data["noisy"][crop]
    clean = data["clean"][crop]
    rots = data["rotations"]
    shift = float(data["shift"])
    m = int(data["n_avg"])
    rows = []

    def row(method, **kw):
        r = {"snr": float(data["snr"]), "shift": shift, "method": method, **kw,
             "load_average": os.getloadavg()[0]}
        rows.append(r)
        return r

    # Maintenance note: the particle's overall shape dominates every projection: the plain mean
    # of ALL noisy images, with no alignment at all, correlates 0.941-0.947 with each clean
    # projection at every SNR here (SNR 4 to 1/16), more than ASPIRE's class averages below SNR
    # 1. So every average is also scored by ``corr_detail``, the correlation once the mean of
    # all clean images is subtracted from both, and that global mean is a row of its own.
    blob = clean.mean(0, keepdims=True)
    # baselines: the noisy image itself, and the mean of all images (no alignment)
    row("noisy", **average_scores(X, clean, m, blob))
    row("mean of all noisy images (no alignment)",
        **average_scores(np.broadcast_to(X.mean(0, keepdims=True), X.shape), clean, m, blob))

    # ASPIRE, from part (a)
    refl = data["reflections"]
    classes = data["classes"]
    sc = neighbour_scores(rots, classes[:, 1:], refl[:, 1:])
    sc_unmirrored = float(np.mean(~refl[:, 1:K_METRIC + 1]))
    n = X.shape[0]
    row("ASPIRE RIRClass2D + BFTAverager2D", **sc,
        share_mirrored=1.0 - sc_unmirrored,
        **average_scores(data["averages"][crop], clean, m, blob),
        seconds_neighbors=float(data["seconds_classify"]),
        seconds_averages=float(data["seconds_average"]),
        seconds_averages_all_n=float(data["seconds_average"]) * n / m)

    Xi = X.reshape(n, 1, *X.shape[1:])
    for method in args.methods:
        mirror = method.endswith("mirror") or "mirror-" in method
        if method.startswith("knn"):
            # aligned_neighbors (72 angles), then the one-step aligned average: the two halves
            # of class_averages(X, n_neighbors=k, n_rotations=72, ...), run apart so that the
            # neighbours are scored and each half timed
            blur = args.blur if method.endswith("blur") else 0.0
            pca = "-pca" in method
            center = method.endswith("center")
            t0 = time.perf_counter()
            Xs, den = X, None
            if blur:
                from scipy.ndimage import gaussian_filter

                Xs = gaussian_filter(X, (0, blur, blur))
            if pca:
                # the search on a denoised copy, as class_averages(denoise=...) runs it
                from invariant_cluster import DihedralPCA

                den = DihedralPCA(args.pca_components, output_size=args.pca_size)
            ind, tau = aligned_neighbors(Xs, n_neighbors=args.k, n_rotations=72,
                                         max_translation=shift, refine=args.refine,
                                         reflection=mirror, denoise=den, center=center,
                                         device="cpu")
            t_knn = time.perf_counter() - t0
            mirrored = tau[..., 3].astype(bool) if mirror else None
            t0 = time.perf_counter()
            avg = one_step_average(Xi, ind, tau, args.k)
            t_avg = time.perf_counter() - t0
            on_pca = (f", search on DihedralPCA({args.pca_components}, "
                      f"output_size={args.pca_size})") if pca else ""
            name = (f"ours: invariant kNN (72 angles{', mirrors' if mirror else ''}"
                    f"{f', search on a blur sigma={blur:g} px' if blur else ''}{on_pca}"
                    f"{', centred' if center else ''})"
                    f" + one-step average of k={args.k}")
            row(name, **neighbour_scores(rots, ind, mirrored),
                share_mirrored=None if mirrored is None else float(
                    mirrored[:, :K_METRIC].mean()),
                **average_scores(avg, clean, m, blob),
                corr_all_n=float(np.median(correlations(avg, clean))),
                seconds_neighbors=t_knn, seconds_averages=t_avg)
        elif method.startswith("means"):
            # invariant attention to its fixed point: each sample's invariant mean
            est = InvariantAttentionClusterer(n_rotations=72, max_translation=shift,
                                              reflection=mirror, device="cpu", random_state=0)
            t0 = time.perf_counter()
            est.fit(X)
            t_fit = time.perf_counter() - t0
            M = est.invariant_means_.reshape(X.shape)
            # neighbors_ carries no mirror bit: scored only without reflections
            sc = {} if mirror else neighbour_scores(rots, est.neighbors_[:, 1:])
            row(f"ours: InvariantAttentionClusterer(n_rotations=72"
                f"{', reflection=True' if mirror else ''}).invariant_means_", **sc,
                **average_scores(M, clean, m, blob),
                corr_all_n=float(np.median(correlations(M, clean))),
                seconds_fit=t_fit, n_clusters=int(est.n_clusters_))
            if method.endswith("search"):
                # the route ASPIRE takes (denoise, then compare): the kNN search again, on the
                # denoised invariant means instead of the noisy images
                knn = InvariantKNeighborsTransformer(n_neighbors=args.k, n_rotations=72,
                                                     max_translation=shift, refine=args.refine,
                                                     reflection=mirror, device="cpu")
                t0 = time.perf_counter()
                knn.fit(M)
                _, ind, tau = knn.kneighbors(return_alignments=True)
                t_knn = time.perf_counter() - t0
                mirrored = tau[..., 3].astype(bool) if mirror else None
                row(f"ours: invariant kNN (72 angles{', mirrors' if mirror else ''}) searched "
                    "again on the invariant means", **neighbour_scores(rots, ind, mirrored),
                    share_mirrored=None if mirrored is None else float(
                        mirrored[:, :K_METRIC].mean()),
                    seconds_neighbors=t_knn + t_fit)
        else:
            raise ValueError(f"--methods: unknown method {method!r}")
    return rows


# --------------------------------------------------------------------------- the CTF suite
DEFOCUS_UM = np.linspace(1.5, 2.5, 7)
CTF_KW = dict(voltage=200.0, Cs=2.0, alpha=0.1)
PIXEL_SIZE = 5.0


def aspire_ctf_part(args):
    """Simulate (with or without CTF), ASPIRE's Cov2D denoiser and RIRClass2D neighbours."""
    import aspire
    from aspire.basis import FFBBasis2D
    from aspire.classification import RIRClass2D
    from aspire.denoising import DenoiserCov2D
    from aspire.noise import WhiteNoiseAdder
    from aspire.operators import RadialCTFFilter
    from aspire.source import Simulation
    from aspire.volume import AsymmetricVolume

    L, n = args.L, args.n
    vol = AsymmetricVolume(L=L, C=1, seed=0, dtype=np.float64).generate()
    filters = ([RadialCTFFilter(defocus=d * 1e4, **CTF_KW) for d in DEFOCUS_UM]
               if args.ctf_one else None)
    shift = float(args.shift_one or 0.0)
    # offsets as the aspire-classes suite draws them
    offsets = (np.random.default_rng(1).uniform(-shift, shift, (n, 2)) if shift > 0 else 0)
    sim = Simulation(L=L, n=n, vols=vol, offsets=offsets, amplitudes=1, seed=0,
                     dtype=np.float64, unique_filters=filters, pixel_size=PIXEL_SIZE,
                     noise_adder=WhiteNoiseAdder.from_snr(args.snr, seed=2))
    noisy = sim.images[:].asnumpy()
    clean = sim.clean_images[:].asnumpy()
    # the projections without CTF, shifted as the images are (ASPIRE shifts its clean images
    # by the simulation's offsets the same way)
    proj = sim.projections[:]
    proj = (proj.shift(np.asarray(sim.offsets)) if shift > 0 else proj).asnumpy()
    noise_var = float(sim.noise_adder.noise_var)
    defocus = (np.array([DEFOCUS_UM[i] * 1e4 for i in sim.filter_indices])
               if args.ctf_one else np.zeros(n))
    m = min(args.n_avg, n)

    t0 = time.perf_counter()
    basis = FFBBasis2D(L, dtype=np.float64)
    den = DenoiserCov2D(sim, basis=basis, var_noise=noise_var)
    denoised = den.denoise[:m].asnumpy()
    t_cov = time.perf_counter() - t0

    t0 = time.perf_counter()
    src = sim.phase_flip() if args.ctf_one else sim
    clf = RIRClass2D(src, fspca_components=400, bispectrum_components=300,
                     n_nbor=args.k + 1, large_pca_implementation="legacy",
                     nn_implementation="legacy", bispectrum_implementation="legacy", seed=0)
    classes, refl, _ = clf.classify()
    t_classify = time.perf_counter() - t0

    # ASPIRE's class averages: DefaultClassAvgSource's classifier (RIRClass2D) and averager
    # (BFTAverager2D), on the images the classifier saw (phase-flipped with a CTF), for the
    # first m images' own classes (DefaultClassAvgSource would select classes instead)
    from aspire.classification import BFTAverager2D

    t0 = time.perf_counter()
    averager = BFTAverager2D(clf.pca_basis.basis, src, dtype=np.float64)
    avgs = averager.average(classes[:m], refl[:m]).asnumpy().astype(np.float32)
    t_avg = time.perf_counter() - t0

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez(out, noisy=noisy.astype(np.float32), clean=clean.astype(np.float32),
             projections=proj.astype(np.float32), rotations=np.asarray(sim.rotations),
             defocus=defocus, noise_var=noise_var, cov2d=denoised.astype(np.float32),
             classes=np.asarray(classes), reflections=np.asarray(refl, dtype=bool),
             averages=avgs, seconds_average=t_avg,
             seconds_cov2d=t_cov, seconds_classify=t_classify, n_avg=m,
             aspire_version=aspire.__version__, snr=args.snr, ctf=bool(args.ctf_one),
             shift=shift)
    print(f"ASPIRE {aspire.__version__}: Cov2D {t_cov:.1f} s, classify {t_classify:.1f} s, "
          f"averages of {m} classes {t_avg:.1f} s -> {out}", flush=True)


def rel_mse(A, P):
    a = A.reshape(len(A), -1).astype(np.float64)
    p = P.reshape(len(P), -1).astype(np.float64)
    return float(np.median(((a - p) ** 2).sum(1) / (p ** 2).sum(1)))


def _components_kept(den, X, ctf):
    """How many directions ``den`` (unfitted; class_averages fits a clone) keeps on the images
    the search sees (phase-flipped with a CTF)."""
    from sklearn.base import clone

    from invariant_cluster.ctf import phase_flip

    Xs = X if ctf is None else np.asarray(phase_flip(X, ctf))
    return int(clone(den).fit(Xs).n_components_)


def ours_ctf_part(data, args):
    """Ours on the full images against ASPIRE's Cov2D and RIRClass2D (the CTF suite)."""
    from invariant_cluster import DihedralPCA, RadialWiener, SteerableWiener, class_averages
    from invariant_cluster.ctf import CTF, CTF_GROUPS, spectral_snr, wiener_filter
    from invariant_cluster.denoise import estimate_noise_std
    from invariant_cluster.steerable import steerable_class_averages

    has_ctf = bool(data["ctf"])
    snr = float(data["snr"])
    # offsets: the search covers them (as the aspire-classes suite's "-center" methods)
    shift = float(data["shift"]) if "shift" in data else 0.0
    # ASPIRE's contrast is the raw micrograph's (its CTF is minus RELION's): ours get -images
    X = -data["noisy"] if has_ctf else data["noisy"]
    P = data["projections"]
    n, L = X.shape[0], X.shape[-1]
    m = int(data["n_avg"])
    rots = data["rotations"]
    ctf = (CTF(data["defocus"], voltage=CTF_KW["voltage"], spherical_aberration=CTF_KW["Cs"],
               amplitude_contrast=CTF_KW["alpha"], pixel_size=PIXEL_SIZE)
           if has_ctf else None)
    blob = P.mean(0, keepdims=True)
    rows = []

    def row(method, avg=None, **kw):
        r = {"snr": snr, "ctf": has_ctf, "L": L, "shift": shift, "method": method, **kw}
        if avg is not None:
            r.update(average_scores(avg, P, m, blob), rel_mse=rel_mse(avg[:m], P[:m]))
        r["load_average"] = os.getloadavg()[0]
        rows.append(r)

    row("noisy", X)
    row("ASPIRE DenoiserCov2D (FFBBasis2D, true noise variance)", data["cov2d"],
        seconds=float(data["seconds_cov2d"]))
    refl = data["reflections"]
    row("ASPIRE RIRClass2D neighbours" + (" (phase-flipped)" if has_ctf else ""),
        **neighbour_scores(rots, data["classes"][:, 1:], refl[:, 1:]),
        seconds_neighbors=float(data["seconds_classify"]))
    if "averages" in data:
        # the first m images' class averages (no CTF correction: the averager sees the
        # classifier's images, phase-flipped with a CTF); seconds scaled to all n images
        row("ASPIRE RIRClass2D + BFTAverager2D (DefaultClassAvgSource's classifier and "
            "averager" + (", phase-flipped images)" if has_ctf else ")"), data["averages"],
            seconds=float(data["seconds_classify"]) + float(data["seconds_average"]) * n / m)

    # our filter alone, no alignment (a control)
    t0 = time.perf_counter()
    if has_ctf:
        filt = wiener_filter(X, ctf, snr=spectral_snr(X, ctf, snr=snr))
        name = "ours: ctf.wiener_filter alone (no alignment)"
    else:
        filt = RadialWiener().fit_transform(X.reshape(n, -1)).reshape(X.shape)
        name = "ours: RadialWiener alone (no alignment)"
    row(name, filt, seconds=time.perf_counter() - t0)
    if not has_ctf:
        # the covariance Wiener filter in the Fourier-Bessel basis: Cov2D's method, our code
        t0 = time.perf_counter()
        filt = SteerableWiener().fit_transform(X).reshape(X.shape)
        row("ours: SteerableWiener alone (no alignment, noise measured)", filt,
            seconds=time.perf_counter() - t0)
        # the same given the true noise, and 5% under or over it: an underestimate lets
        # directions of pure noise through
        true_std = float(np.sqrt(data["noise_var"]))
        for factor in (1.0, 0.95, 1.05):
            t0 = time.perf_counter()
            filt = SteerableWiener(noise_std=factor * true_std).fit_transform(X).reshape(X.shape)
            row(f"ours: SteerableWiener alone (noise_std = {factor:g} x the true noise)", filt,
                seconds=time.perf_counter() - t0)

    # class_averages(X, ctf=...): the search on the phase-flipped images' DihedralPCA copy,
    # then each image's one-step average: with snr (or a CTF) the Wiener estimate, the noise
    # measured ("auto") or the true SNR given (as Cov2D is given the true noise variance)
    # the last: as many directions as stand above the noise (n_components="auto"), on a
    # 32 x 32 copy
    # with a CTF, the search across CTF groups (the default ctf_groups) and, for the before /
    # after in the same run, on the phase-flipped images alone (ctf_groups=1)
    pca = (args.pca_components, args.pca_size)
    variants = [("fourier", "auto", pca, CTF_GROUPS),
                ("fourier", snr if has_ctf else None, pca, CTF_GROUPS),
                ("geometric", "auto" if has_ctf else None, pca, CTF_GROUPS),
                ("fourier", "auto", ("auto", 32), CTF_GROUPS)]
    if has_ctf:
        variants += [("fourier", "auto", pca, 1)] + [("fourier", "auto", ("auto", 32), g)
                                                     for g in (1, 2, 8)]
    for centre, wiener, (comps, size), groups in variants:
        if centre not in args.centres:
            continue
        t0 = time.perf_counter()
        den = DihedralPCA(comps, output_size=size)
        avg, ind, tau = class_averages(
            X, n_neighbors=args.k, n_rotations=72, reflection=True, refine=args.refine,
            ctf=ctf, ctf_groups=groups, snr=wiener, rotation_center=centre,
            return_alignments=True, device="cpu", denoise=den, max_translation=shift,
            center=shift > 0)
        seconds = time.perf_counter() - t0
        row(f"ours: class_averages(72 angles, mirrors, DihedralPCA({comps!r}, "
            f"output_size={size}), rotation_center={centre!r}"
            f"{f', max_translation={shift:g}, center=True' if shift > 0 else ''}"
            f"{f', ctf, ctf_groups={groups}' if has_ctf else ''}, snr={wiener!r}), "
            f"k={args.k}", avg,
            **neighbour_scores(rots, ind, tau[..., 3].astype(bool)), seconds=seconds,
            **({"n_components": _components_kept(den, X, ctf)} if comps == "auto" else {}))
        if not has_ctf and wiener is None and centre == "fourier":
            # the plain means of k + 1 images: white noise of std noise_std / sqrt(k + 1),
            # filtered with the covariance of the averages themselves
            t0 = time.perf_counter()
            sigma = estimate_noise_std(X[:, None]) / np.sqrt(args.k + 1)
            filt = SteerableWiener(noise_std=sigma).fit_transform(avg).reshape(X.shape)
            row(f"ours: the same averages (plain means) + SteerableWiener(noise_std=measured / "
                f"sqrt({args.k + 1})), k={args.k}", filt,
                **neighbour_scores(rots, ind, tau[..., 3].astype(bool)),
                seconds=seconds + time.perf_counter() - t0)
            # the same blended with the images filtered alone, as the risk estimate on the data
            # says
            t0 = time.perf_counter()
            out, choice = steerable_class_averages(
                X, n_neighbors=args.k, n_rotations=72, reflection=True, refine=args.refine,
                device="cpu", denoise=DihedralPCA(comps, output_size=size),
                rotation_center="fourier", return_choice=True)
            row(f"ours: steerable_class_averages (the filtered means and the images filtered "
                f"alone, blended by the weight of least recorrupted-to-recorrupted risk), "
                f"k={args.k}", out.reshape(X.shape), choice=choice["choice"],
                weight_single=choice["weight_single"],
                risk_single=choice["risk"]["single"], risk_averages=choice["risk"]["averages"],
                risk_blend=choice["risk"]["blend"], seconds=time.perf_counter() - t0)
    return rows


def run_ctf_suite(args, p, env, workdir):
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _common import RESULTS, environment, print_table, write_json

    out = Path(args.out) if args.out else RESULTS / "cryoem.json"
    run = args.run or ("ctf_quick" if args.quick else "ctf")
    rows, versions = [], set()

    def summary():
        return {"benchmark": "cryoem_ctf", "n": args.n, "L": args.L, "n_avg": args.n_avg,
                "k": args.k, "refine": args.refine, "threads": args.threads,
                "defocus_um": DEFOCUS_UM.tolist(), "ctf": CTF_KW | {"pixel_size": PIXEL_SIZE},
                "aspire_version": sorted(versions), "environment": environment(),
                "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]), "rows": rows}

    cols = ["snr", "ctf", "method", "nbr10", "corr", "corr_detail", "rel_mse", "seconds"]
    for has_ctf, shift, snr in ((c, s, r) for c in args.ctf for s in args.ctf_shift
                                for r in args.snr):
        npz = workdir / f"ctf{int(has_ctf)}_{_tag(snr, shift, args.n)}_L{args.L}.npz"
        if not args.skip_aspire and not (npz.exists() and not args.force_aspire):
            if not args.aspire_python:
                p.error("--aspire-python (or $ASPIRE_PYTHON) is required to run ASPIRE")
            workdir.mkdir(parents=True, exist_ok=True)
            subprocess.run([args.aspire_python, str(Path(__file__).resolve()), "--part",
                            "aspire-ctf", "--snr-one", repr(snr), "--ctf-one",
                            str(int(has_ctf)), "--shift-one", repr(shift),
                            "--n", str(args.n), "--L", str(args.L),
                            "--n-avg", str(args.n_avg), "--k", str(args.k), "--out",
                            str(npz)], check=True, env=env, cwd=workdir)
        with np.load(npz) as f:
            data = {key: f[key] for key in f.files}
        versions.add(str(data["aspire_version"]))
        new = ours_ctf_part(data, args)
        print_table(new, cols)
        rows.extend(new)
        write_json(summary(), out, run=run)
    print()
    print_table(rows, cols)
    write_json(summary(), out, run=run)


# --------------------------------------------------------------------------- driver
def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--suite", choices=["aspire-classes", "ctf"], default="aspire-classes",
                   help="'ctf': Cov2D and our averages with and without a CTF, on the full "
                        "images (run 'ctf' of cryoem.json)")
    p.add_argument("--ctf", type=lambda t: t == "yes", nargs="+", default=[False, True],
                   metavar="no|yes", help="the CTF suite's settings (default: no yes)")
    p.add_argument("--ctf-shift", type=float, nargs="+", default=[0.0], metavar="PX",
                   help="the CTF suite's offsets: uniform within +-PX pixels (default 0)")
    p.add_argument("--centres", nargs="+", default=["fourier", "geometric"],
                   choices=["fourier", "geometric"],
                   help="the CTF suite's rotation centres for our search")
    p.add_argument("--part", choices=["all", "aspire", "aspire-ctf"], default="all",
                   help="'aspire' is run by the driver under the ASPIRE interpreter")
    p.add_argument("--aspire-python", default=os.environ.get("ASPIRE_PYTHON"),
                   help="python of the environment where ASPIRE is installed "
                        "(default: $ASPIRE_PYTHON)")
    p.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(),
                                                     "invariant_cluster_cryoem"))
    p.add_argument("--snr", type=float, nargs="+", default=[4.0, 1.0, 0.25, 0.0625])
    p.add_argument("--shift", type=float, nargs="+", default=[0.0, 2.0])
    p.add_argument("--n", type=int, default=2000)
    p.add_argument("--L", type=int, default=64)
    p.add_argument("--n-avg", type=int, default=200,
                   help="images whose class averages are compared (ASPIRE's averager is slow)")
    p.add_argument("--k", type=int, default=10,
                   help="neighbours per class average, ASPIRE's (n_nbor) and ours")
    p.add_argument("--refine", action="store_true",
                   help="refine our kNN alignments (off: the 5-degree, 1-px grid)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--skip-aspire", action="store_true",
                   help="never run ASPIRE: only the .npz files already in --workdir")
    p.add_argument("--force-aspire", action="store_true",
                   help="run ASPIRE again even where its .npz is already in --workdir")
    p.add_argument("--methods", nargs="+", default=["knn", "knn-mirror", "means"],
                   choices=["knn", "knn-mirror", "knn-mirror-blur", "knn-mirror-pca",
                            "knn-mirror-pca-center", "means",
                            "means-mirror", "means-mirror-search"],
                   help="ours to run ('-mirror': reflection=True; '-blur' / '-pca': the search "
                        "on Gaussian-blurred / DihedralPCA-denoised images, the average of the "
                        "noisy ones)")
    p.add_argument("--blur", type=float, default=1.5, help="sigma (px) of '-blur' methods")
    p.add_argument("--pca-components", type=int, default=40,
                   help="n_components of the DihedralPCA of '-pca' methods")
    p.add_argument("--pca-size", type=int, default=24,
                   help="output_size of the DihedralPCA of '-pca' methods")
    p.add_argument("--quick", action="store_true", help="n = 600, SNR 1, no shift")
    p.add_argument("--out", default=None, help="the JSON (default: results/cryoem.json)")
    p.add_argument("--run", default=None, help="the run's key in the JSON (default: 'ctf' with "
                   "--suite ctf, 'quick' with --quick, else 'default'; the other committed runs "
                   "are named ctf_128, ctf_20000, ctf_k20, ctf_shift2, ctf_snr1)")
    # used by --part aspire
    p.add_argument("--snr-one", type=float, help=argparse.SUPPRESS)
    p.add_argument("--shift-one", type=float, help=argparse.SUPPRESS)
    p.add_argument("--ctf-one", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args.part == "aspire":
        args.snr, args.shift = args.snr_one, args.shift_one
        aspire_part(args)
        return
    if args.part == "aspire-ctf":
        args.snr = args.snr_one
        aspire_ctf_part(args)
        return

    if args.quick:
        args.n, args.snr, args.shift, args.n_avg = 600, [1.0], [0.0], 100
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _common import RESULTS, environment, print_table, write_json

    torch.set_num_threads(args.threads)
    env = dict(os.environ, TQDM_DISABLE="1", OMP_NUM_THREADS=str(args.threads),
               MKL_NUM_THREADS=str(args.threads), OPENBLAS_NUM_THREADS=str(args.threads))
    workdir = Path(args.workdir)
    if args.suite == "ctf":
        run_ctf_suite(args, p, env, workdir)
        return
    rows, versions = [], set()
    out = Path(args.out) if args.out else RESULTS / "cryoem.json"
    run = args.run or ("quick" if args.quick else "default")

    def summary(rows):
        return {"benchmark": "cryoem", "n": args.n, "L": args.L, "n_avg": args.n_avg,
                "k": args.k, "refine": args.refine, "blur": args.blur, "threads": args.threads,
                "methods": args.methods, "aspire_version": sorted(versions),
                "environment": environment(),
                "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]), "rows": rows}
    for shift in args.shift:
        for snr in args.snr:
            npz = workdir / f"{_tag(snr, shift, args.n)}.npz"
            if not args.skip_aspire and not (npz.exists() and not args.force_aspire):
                if not args.aspire_python:
                    p.error("--aspire-python (or $ASPIRE_PYTHON) is required to run ASPIRE; "
                            "see the module docstring to install it")
                cmd = [args.aspire_python, str(Path(__file__).resolve()), "--part", "aspire",
                       "--snr-one", repr(snr), "--shift-one", repr(shift), "--n", str(args.n),
                       "--L", str(args.L), "--n-avg", str(args.n_avg),
                       "--k", str(args.k), "--out", str(npz)]
                # ASPIRE writes its log files into the working directory: keep them out of
                # the repository
                workdir.mkdir(parents=True, exist_ok=True)
                subprocess.run(cmd, check=True, env=env, cwd=workdir)
            with np.load(npz) as f:
                data = {key: f[key] for key in f.files}
            versions.add(str(data["aspire_version"]))
            new = ours_part(data, args)
            print_table(new, ["snr", "shift", "method", "nbr10", "med_angle", "corr",
                              "corr_detail"])
            rows.extend(new)
            write_json(summary(rows), out, run=run)  # after every setting: a partial run keeps it

    cols = ["snr", "shift", "method", "nbr10", "med_angle", "share_mirrored", "corr", "corr_detail",
            "seconds_neighbors", "seconds_averages", "seconds_averages_all_n", "seconds_fit"]
    print()
    print_table(rows, cols)
    write_json(summary(rows), out, run=run)


if __name__ == "__main__":
    main()
