"""Helpers of the command line (:mod:`invariant_cluster.cli`): argument types, warnings as
lines, the output folder and the files common to several commands.

Importing this module is cheap (no torch, no NumPy), as the command line's ``--help`` needs.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from contextlib import contextmanager
from pathlib import Path

PROG = "invariant-cluster"


class UsageError(Exception):
    """Bad input found after parsing: reported as one line, exit status 2."""


def _version():
    from . import __version__

    return __version__


def _number(kind, low, *, what, strict=False, high=None):
    """An argparse type: a finite ``kind`` (int or float) >= ``low`` (> with ``strict``), at
    most ``high``; otherwise the error says ``expected <what>``."""

    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if (value is None or not math.isfinite(value) or value < low
                or (strict and value == low) or (high is not None and value > high)):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return value

    return parse


_positive_int = _number(int, 1, what="a positive integer")
_nonnegative_int = _number(int, 0, what="an integer >= 0")
_nonnegative_float = _number(float, 0, what="a finite number >= 0")
_angle = _number(float, 0, high=180, what="degrees in [0, 180]")
_positive_float = _number(float, 0, strict=True, what="'auto' or a positive number")


_components_int = _number(int, 1, what="'auto' or a positive integer")


def _components(text):
    return text if text == "auto" else _components_int(text)


def _bandwidth(text):
    return text if text == "auto" else _positive_float(text)


_noise_float = _number(float, 0, what="'auto' or a number >= 0")


def _noise_std(text):
    return text if text == "auto" else _noise_float(text)


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


def shared_options(values, *accepting, skip=()):
    """The entries of ``values`` (the parsed options, or a fitted estimator's ``get_params()``)
    that every one of ``accepting`` takes (an estimator class: its ``get_params()``; a
    function: its keywords) and that are given (not None), so that the defaults of the
    estimator or function apply otherwise. ``skip``: names the command sets itself."""
    import inspect

    def names(target):
        if isinstance(target, type):
            return set(target().get_params(deep=False))
        return set(inspect.signature(target).parameters)

    keep = set.intersection(*(names(t) for t in accepting)) - set(skip)
    return {k: v for k, v in dict(values).items() if k in keep and v is not None}


def _check_out(path):
    """Create ``--out`` and make sure that a file can be written there, BEFORE the long part.

    An empty path (an unset shell variable, ``--out "$OUTDIR"``) is refused rather than read as
    the current folder, whose files of the same names the run would replace."""
    if not str(path).strip():
        raise UsageError("--out: empty folder name (an unset variable?); name the output "
                         "folder, e.g. --out results, or --out . for the current folder")
    out = Path(path)
    probe = out / f".{PROG}-write-test"
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise UsageError(f"--out {out}: cannot write there ({exc.strerror or exc})") from None
    return out


@contextmanager
def _replacing(out, names):
    """Write a command's files into a staging folder inside ``out``, then put them in place of
    the command's files of an earlier run.

    ``names`` is every file the command may write (no other command writes any of them). The
    command writes into the folder yielded; once it is done, its files of an earlier run that
    this run did not write are removed and the new ones are renamed into ``out``. When writing
    fails or is interrupted, ``out`` keeps the earlier run as it was, with nothing partial
    beside it. Any other file (another command's, the user's) is never touched."""
    import shutil
    import tempfile

    stage = Path(tempfile.mkdtemp(prefix=f".{PROG}-", dir=out))
    try:
        yield stage
        written = {p.name for p in stage.iterdir()}
        if not written <= set(names):  # a file the command does not declare as its own
            raise RuntimeError(f"wrote {sorted(written - set(names))}, not among this "
                               f"command's files {list(names)}")
        for name in names:
            if name not in written:
                (out / name).unlink(missing_ok=True)
        for name in sorted(written):
            os.replace(stage / name, out / name)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _check_finite(**results):
    """Refuse to write results that are not finite (e.g. from values that overflow float32)."""
    import numpy as np

    bad = [name for name, a in results.items() if not np.isfinite(np.asarray(a)).all()]
    if bad:
        raise RuntimeError(f"the computation gave non-finite {', '.join(bad)}; rescale the "
                           "images (e.g. to [0, 1]) and run again")


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


def _save_figure(ax, path):
    import matplotlib.pyplot as plt

    fig = ax.figure
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _write_labels(out, labels, y, names, file="labels.csv", shapes=None):
    """``file`` (``labels.csv``): each image (index or file name), its cluster, its shape
    (``shapes``: the group of copies it belongs to, where given) and its true label."""
    ids = names if names is not None else list(range(len(labels)))
    id_col = "file" if names is not None else "index"
    header = ([id_col, "label"] + (["shape"] if shapes is not None else [])
              + (["true_label"] if y is not None else []))
    rows = [[ids[i], int(labels[i])] + ([int(shapes[i])] if shapes is not None else [])
            + ([y[i].item()] if y is not None else [])
            for i in range(len(labels))]
    _write_csv(out / file, header, rows)
    return ids, id_col


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
