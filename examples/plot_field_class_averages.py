"""
Class averages of real particles (RELION, cryoSPARC, EMPIAR)
============================================================

Particle stacks and their metadata as the field's software writes them, read through
:func:`~invariant_cluster.datasets.load_mrc`, :func:`~invariant_cluster.ctf.read_star` and
:func:`~invariant_cluster.ctf.read_cs`, then averaged with their CTF by
:func:`~invariant_cluster.class_averages`:

- ``relion31.mrcs`` + ``relion31.star``: 5 particles of 256 x 256 pixels with a RELION 3.1
  STAR file (an optics block). The MRC header has no ``MAP`` ID string and no machine stamp,
  as older programs write it: it is read with a warning;
- ``empiar_10076_7.mrc`` + ``.star`` + ``.cs``: 7 particles of 320 x 320 pixels of EMPIAR-10076,
  saved as ``.mrc`` with a volume's header, with a RELION 3.0 STAR file (the pixel size from
  the detector pixel size and the magnification) and the same particles' cryoSPARC metadata.

The files come from the test data of cryoDRGN (github.com/ml-struct-bio/cryodrgn,
``tests/data/``, GPL-3.0). They are not copied into this repository: the script reads them from
``../../shared/data/field`` relative to ``examples/`` (or ``field/`` in the first folder of
``$INVARIANT_CLUSTER_DATA``), and prints a message and stops where they are absent. The
``class-averages`` command does the same on these files (:doc:`/user_guide/cryoem`).
"""

# %%
# Where the files are
# -------------------
# The first folder holding the files; reading them needs ``mrcfile`` and ``starfile``
# (``pip install invariant_cluster[cryoem]``).
import importlib.util
import os
import warnings
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from scipy.ndimage import gaussian_filter

from invariant_cluster import class_averages
from invariant_cluster.ctf import read_cs, read_star
from invariant_cluster.datasets import load_mrc

DATA_HOME = os.environ.get("INVARIANT_CLUSTER_DATA", "").split(os.pathsep)[0]
FIELD = next((p for p in (Path(DATA_HOME, "field") if DATA_HOME else None,
                          Path("../../shared/data/field"))
              if p is not None and (p / "relion31.mrcs").is_file()), None)
MISSING = [m for m in ("mrcfile", "starfile") if importlib.util.find_spec(m) is None]
READY = FIELD is not None and not MISSING
if FIELD is None:
    print("the field's files (../../shared/data/field) are absent: nothing to show here")
elif MISSING:
    print(f"reading the field's files needs {', '.join(MISSING)} "
          "(pip install invariant_cluster[cryoem]): nothing to show here")

# %%
# A RELION 3.1 stack with an old header
# -------------------------------------
# ``load_mrc`` reads a header without the ID string and the machine stamp, and says so in a
# ``RuntimeWarning``. ``read_star`` joins the particles with their optics group; ``n_images``
# checks that the file has one row per image of the stack.
if READY:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        relion = load_mrc(FIELD / "relion31.mrcs")
    print("warning:", caught[0].message if caught else None)
    relion_ctf, relion_table = read_star(FIELD / "relion31.star", n_images=len(relion))
    print(f"{relion.shape[0]} images of {relion.shape[1]} x {relion.shape[2]} px, "
          f"{relion_ctf.pixel_size[0]:.3f} Å/px, defocus "
          f"{relion_ctf.defocus_u.min():.0f}-{relion_ctf.defocus_u.max():.0f} Å, "
          f"{relion_ctf.voltage[0]:.0f} kV")

# %%
# An EMPIAR stack saved as ``.mrc``, with its STAR and ``.cs`` files
# ------------------------------------------------------------------
# The header of ``empiar_10076_7.mrc`` says "a volume of 7 sections" (space group 1):
# ``as_stack=True`` reads the sections as images (the ``class-averages`` command does so when
# the STAR file names the images ``N@empiar_10076_7.mrc``, or with ``--stack``). The RELION 3.0
# STAR file has no pixel size column: it comes from ``rlnDetectorPixelSize`` (µm) x 10^4 /
# ``rlnMagnification``. cryoSPARC's ``.cs`` file holds the same CTF, its astigmatism angle in
# radians.
if READY:
    empiar = load_mrc(FIELD / "empiar_10076_7.mrc", as_stack=True)
    star_ctf, star_table = read_star(FIELD / "empiar_10076_7.star", n_images=len(empiar))
    cs_ctf, cs_table = read_cs(FIELD / "empiar_10076_7.cs", n_images=len(empiar))
    print(f"{empiar.shape[0]} images of {empiar.shape[1]} x {empiar.shape[2]} px, "
          f"{star_ctf.pixel_size[0]:.4f} Å/px from the STAR file, "
          f"{cs_ctf.pixel_size[0]:.4f} Å/px from the .cs file")
    for field in ("defocus_u", "defocus_v", "defocus_angle", "voltage", "spherical_aberration",
                  "amplitude_contrast", "pixel_size"):
        diff = np.abs(getattr(star_ctf, field) - getattr(cs_ctf, field)).max()
        print(f"  {field:21s} STAR {getattr(star_ctf, field)[0]:10.4f}, "
              f"largest difference with the .cs file {diff:.1e}")

# %%
# CTF-aware class averages
# ------------------------
# Each particle's class average, in its own pose: the particle and its nearest neighbours
# searched on the phase-flipped images (24 angles and the mirror), each aligned onto it, and
# their Wiener estimate without the CTF, the signal-to-noise ratio of each frequency measured on
# the images (``snr="auto"``, the default with ``ctf``). With 5 and 7 particles every other
# particle is a neighbour; on a stack of thousands, ``n_neighbors=10`` to 20 picks images of the
# same view.
if READY:
    relion_avg = class_averages(relion, n_neighbors=len(relion) - 1, ctf=relion_ctf,
                                n_rotations=24, reflection=True, device="cpu")
    empiar_avg = class_averages(empiar, n_neighbors=len(empiar) - 1, ctf=cs_ctf,
                                n_rotations=24, reflection=True, device="cpu")
    print(relion_avg.shape, empiar_avg.shape)

# %%
# Particles beside their averages
# -------------------------------
# For each stack: the particles, the same low-passed by a Gaussian of 3 px for display (the
# Wiener estimate keeps only the frequencies that stand above the noise, mostly low ones), and
# their class averages. The five RELION particles share a diagonal stripe pattern of their
# micrograph, which their averages cross at the angles found: five images are too few for a
# view to emerge. The seven EMPIAR particles give one blob at the centre of every average. The
# averages keep the contrast of the stack as it is in the file.
if READY:
    for name, images, averages in (("relion31.mrcs", relion, relion_avg),
                                   ("empiar_10076_7.mrc", empiar, empiar_avg)):
        rows = (("particle", images),
                ("low-passed", np.stack([gaussian_filter(im, 3) for im in images])),
                ("class average", averages))
        fig, axes = plt.subplots(3, len(images), figsize=(1.5 * len(images), 5.0))
        for r, (label, imgs) in enumerate(rows):
            for i, ax in enumerate(axes[r]):
                ax.imshow(imgs[i], cmap="gray")
                ax.set_xticks([])
                ax.set_yticks([])
                if i == 0:
                    ax.set_ylabel(label, fontsize=8)
        fig.suptitle(name, fontsize=9)
        fig.tight_layout()
    plt.show()

# %%
# The same on the command line
# ----------------------------
# ``invariant-cluster class-averages ../shared/data/field/empiar_10076_7.mrc --star
# ../shared/data/field/empiar_10076_7.cs --one-step --n-neighbors 6 --reflection
# --n-rotations 24 --out classes`` writes these averages to ``classes/class_averages.mrcs``
# and, in ``classes/particles.star``, each particle's class and alignment in RELION's
# convention.
