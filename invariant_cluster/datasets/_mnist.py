"""MNIST and Fashion-MNIST: local loaders, downloads with checksums (see the package docstring
for where the files are looked for)."""

from __future__ import annotations

import hashlib
import logging
import math
import numbers
import os
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from http.client import HTTPException
from pathlib import Path

import numpy as np
from sklearn.utils import Bunch

from ._idx import _as_path, load_idx

logger = logging.getLogger(__name__)

#: Environment variable holding extra data directories (``os.pathsep`` separated).
DATA_ENV = "INVARIANT_CLUSTER_DATA"
#: Environment variable holding download mirrors (whitespace separated base URLs).
MIRROR_ENV = "INVARIANT_CLUSTER_MIRROR"
#: Default download directory below the home directory.
_HOME_SUBDIR = "invariant_cluster_data"
#: Where Debian's ``dataset-*`` packages install data sets (patched in the tests).
_SYSTEM_DATA_DIR = Path("/usr/share/datasets")

# Maintenance note: checksums of the gzip'd files.
# The gzip wrapper carries a time stamp and optionally the original file name, so the same IDX
# content has several valid MD5s. Each entry therefore lists every known good value:
# - MNIST: the original distribution (Y. LeCun's site, mirrored byte for byte by the S3 and GCS
#   mirrors); the test values agree with shared/data/MD5SUMS.
# - Fashion-MNIST: first the values published by Zalando (README of zalandoresearch/fashion-mnist,
#   what its S3 website serves), then those of Debian's package dataset-fashion-mnist
#   (0.0~git20200523.55506a9-1), which re-compressed the same IDX content without the file name
#   in the gzip header (24 resp. 23 bytes shorter); shared/data/MD5SUMS lists the Debian values
#   for the test files.
#: Known MD5 checksums of the ``.gz`` files, ``{dataset: {file name: (md5, ...)}}``.
#: A downloaded file must match one of its values. Patch this dict to test against fake data.
CHECKSUMS: dict[str, dict[str, tuple[str, ...]]] = {
    "mnist": {
        "train-images-idx3-ubyte.gz": ("f68b3c2dcbeaaa9fbdd348bbdeb94873",),
        "train-labels-idx1-ubyte.gz": ("d53e105ee54ea40749a09fcbcd1e9432",),
        "t10k-images-idx3-ubyte.gz": ("9fb629c4189551a2d022fa330f9573f3",),
        "t10k-labels-idx1-ubyte.gz": ("ec29112dd5afa0611ce80d1b7f02629c",),
    },
    "fashion-mnist": {
        "train-images-idx3-ubyte.gz": ("8d4fb7e6c68d591d4c3dfef9ec88bf0d",
                                       "cf8536b0aa1a6ac5fa3f23001093305c"),
        "train-labels-idx1-ubyte.gz": ("25c81989df183df01b3e8a0aad5dffbe",
                                       "10bea18fdb374794d4bb42e356e600c9"),
        "t10k-images-idx3-ubyte.gz": ("bef4ecab320f06d8554ea6380940ec79",
                                      "f78720b4224f21cce2f2ccf2d7a94c9a"),
        "t10k-labels-idx1-ubyte.gz": ("bb300cfdad3c16e7a12a480ee83cd310",
                                      "0d30e22e447f3c33dab9ed536400ac01"),
    },
}

#: Default download mirrors (base URLs, tried in order) per dataset.
MIRRORS: dict[str, tuple[str, ...]] = {
    "mnist": (
        "https://ossci-datasets.s3.amazonaws.com/mnist/",
        "https://storage.googleapis.com/cvdf-datasets/mnist/",
    ),
    "fashion-mnist": ("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",),
}

_SPLIT_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
_SPLITS = ("train", "test", "all")

_MNIST_DESCR = """\
MNIST handwritten digits
------------------------
70,000 grey-level images of handwritten digits 0-9, 28 x 28 pixels, size-normalised and
centred: 60,000 for training and 10,000 for testing. Built by Y. LeCun, C. Cortes and
C. J. C. Burges from NIST's Special Databases 1 and 3.

Licence: CC BY-SA 3.0 (Y. LeCun and C. Cortes).
Loaded from the original IDX files; pixels are scaled from 0..255 to [0, 1]. With
split="all" the 60,000 training images come first, then the 10,000 test images.
See datasets/mnist.md in the project for sources and checksums.
"""

_FASHION_DESCR = """\
Fashion-MNIST
-------------
70,000 grey-level 28 x 28 images of Zalando's article photos in 10 classes (T-shirt/top,
Trouser, Pullover, Dress, Coat, Sandal, Shirt, Sneaker, Bag, Ankle boot): 60,000 for training
and 10,000 for testing, in the same format as MNIST. H. Xiao, K. Rasul and R. Vollgraf (2017),
"Fashion-MNIST: a Novel Image Dataset for Benchmarking Machine Learning Algorithms".

Licence: MIT (Zalando SE).
Loaded from the IDX files; pixels are scaled from 0..255 to [0, 1]. With split="all" the 60,000
training images come first, then the 10,000 test images.
See datasets/fashion-mnist.md in the project for sources and checksums.
"""

_DATASETS = {
    "mnist": {
        "title": "MNIST",
        "loader": "load_mnist",
        "fetcher": "fetch_mnist",
        "target_names": np.arange(10),
        "descr": _MNIST_DESCR,
        "apt": None,
    },
    "fashion-mnist": {
        "title": "Fashion-MNIST",
        "loader": "load_fashion_mnist",
        "fetcher": "fetch_fashion_mnist",
        "target_names": np.array(["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                  "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]),
        "descr": _FASHION_DESCR,
        "apt": "dataset-fashion-mnist",
    },
}


# ----------------------------------------------------------------------------------------------
# MNIST and Fashion-MNIST
# ----------------------------------------------------------------------------------------------


def _check_dataset(dataset) -> str:
    if not isinstance(dataset, str) or dataset not in _DATASETS:
        raise ValueError(f"dataset: expected one of {sorted(_DATASETS)}, got {dataset!r}")
    return dataset


def _check_split(split) -> tuple[str, ...]:
    if not isinstance(split, str) or split not in _SPLITS:
        raise ValueError(f"split: expected one of {list(_SPLITS)}, got {split!r}")
    return ("train", "test") if split == "all" else (split,)


def _env_dirs() -> list[Path]:
    value = os.environ.get(DATA_ENV, "")
    return [Path(p).expanduser() for p in value.split(os.pathsep) if p.strip()]


def _home_dir() -> Path:
    return Path.home() / _HOME_SUBDIR


def _search_dirs(dataset: str, data_home) -> list[Path]:
    """The directories searched for ``dataset``'s files, in order, without duplicates."""
    others = set(_DATASETS) - {dataset}
    bases = []
    if data_home is not None:
        bases.append(_as_path(data_home, "data_home"))
    bases.extend(_env_dirs())
    bases.append(_home_dir())
    dirs = []
    for base in bases:
        dirs.append(base / dataset)
        if base.name not in others:
            dirs.append(base)
    dirs.append(_SYSTEM_DATA_DIR / dataset)
    seen, unique = set(), []
    for d in dirs:
        if d not in seen:
            seen.add(d)
            unique.append(d)
    return unique


def _find(dirs: list[Path], stem: str) -> Path | None:
    for d in dirs:
        for name in (stem + ".gz", stem):
            candidate = d / name
            if candidate.is_file():
                return candidate
    return None


def _missing_message(dataset: str, missing: list[str], dirs: list[Path], data_home) -> str:
    spec = _DATASETS[dataset]
    env = os.environ.get(DATA_ENV, "")
    lines = [
        f"{spec['title']}: could not find "
        + ", ".join(f"{stem}[.gz]" for stem in missing)
        + ". Looked in:"
    ]
    lines += [f"  - {d}" for d in dirs]
    if data_home is None:
        lines.append("  (data_home: not given)")
    if not env.strip():
        lines.append(f"  (${DATA_ENV}: not set)")
    lines.append("To get the data:")
    lines.append(
        f"  - download it: invariant_cluster.datasets.{spec['fetcher']}(download=True) "
        f"(into data_home, else ${DATA_ENV}, else {_home_dir()}), or"
    )
    if spec["apt"]:
        lines.append(
            f"  - on Debian/Ubuntu: apt-get install {spec['apt']} "
            f"(installs {_SYSTEM_DATA_DIR / dataset}), or"
        )
    lines.append(
        f"  - put the files in a folder '{dataset}/' and pass its parent as data_home or "
        f"set ${DATA_ENV} to it."
    )
    return "\n".join(lines)


def _resolve_files(dataset: str, parts, data_home) -> list[Path]:
    dirs = _search_dirs(dataset, data_home)
    stems = [stem for part in parts for stem in _SPLIT_FILES[part]]
    found = {stem: _find(dirs, stem) for stem in stems}
    missing = [stem for stem, path in found.items() if path is None]
    if missing:
        raise FileNotFoundError(_missing_message(dataset, missing, dirs, data_home))
    return [found[stem] for stem in stems]


def _read_pair(images_path: Path, labels_path: Path) -> tuple[np.ndarray, np.ndarray]:
    images = load_idx(images_path)
    labels = load_idx(labels_path)
    if images.dtype != np.uint8 or images.ndim != 3 or images.shape[1:] != (28, 28):
        raise ValueError(
            f"{images_path}: expected uint8 images of shape (n, 28, 28), got "
            f"{images.dtype.name} of shape {images.shape}"
        )
    if labels.dtype != np.uint8 or labels.ndim != 1:
        raise ValueError(
            f"{labels_path}: expected uint8 labels of shape (n,), got {labels.dtype.name} of "
            f"shape {labels.shape}"
        )
    if labels.shape[0] != images.shape[0]:
        raise ValueError(
            f"{labels_path} holds {labels.shape[0]} labels but {images_path} holds "
            f"{images.shape[0]} images"
        )
    if labels.size and labels.max() > 9:
        raise ValueError(f"{labels_path}: expected labels in 0..9, got {int(labels.max())}")
    return images, labels


def _load(dataset: str, split: str, data_home, return_X_y: bool):
    dataset = _check_dataset(dataset)
    parts = _check_split(split)
    paths = _resolve_files(dataset, parts, data_home)
    images, labels = [], []
    for i in range(0, len(paths), 2):
        im, lab = _read_pair(paths[i], paths[i + 1])
        images.append(im)
        labels.append(lab)
    raw = np.concatenate(images) if len(images) > 1 else images[0]
    n = raw.shape[0]
    data = raw.reshape(n, -1).astype(np.float32)
    data /= 255.0
    target = (np.concatenate(labels) if len(labels) > 1 else labels[0]).astype(np.int64)
    if return_X_y:
        return data, target
    spec = _DATASETS[dataset]
    return Bunch(
        data=data,
        images=data.reshape(n, 28, 28),
        target=target,
        target_names=spec["target_names"].copy(),
        feature_names=[f"pixel_{r}_{c}" for r in range(28) for c in range(28)],
        DESCR=spec["descr"],
        filenames=[str(p) for p in paths],
        split=split,
    )


_LOAD_DOC = """Load the {title} {name} split(s) from local IDX files (no network).

    Parameters
    ----------
    split : {{"train", "test", "all"}}, default="test"
        ``"all"`` is the training split followed by the test split. Only the files of the
        requested split(s) need to exist.
    data_home : str or os.PathLike, default=None
        Directory searched first, directly or in its subfolder ``{folder}/``. Then
        ``$INVARIANT_CLUSTER_DATA``, ``~/invariant_cluster_data`` and
        ``/usr/share/datasets/{folder}`` (see the module's docstring).
    return_X_y : bool, default=False
        Return ``(data, target)`` instead of a Bunch.

    Returns
    -------
    bunch : :class:`sklearn.utils.Bunch`
        With ``data`` of shape (n, 784), float32 in [0, 1]; ``images`` of shape (n, 28, 28),
        a view of ``data``; ``target`` of shape (n,), int64 in 0..9; ``target_names``;
        ``feature_names`` (``"pixel_<row>_<col>"``); ``DESCR``; ``filenames``, the files read;
        and ``split``.
    (data, target) : tuple
        If ``return_X_y`` is True.

    Raises
    ------
    FileNotFoundError
        If a file is missing; the message lists every directory searched and how to get the
        data ({how}).
    ValueError
        If ``split`` is not one of the three values, or a file is malformed (see
        :func:`load_idx`) or does not hold 28 x 28 uint8 images resp. labels 0..9 of the same
        length.

    See Also
    --------
    {fetcher} : The same, downloading the missing files first.
    load_digits_images : A small dataset that ships with scikit-learn (offline).

    Examples
    --------
    >>> from invariant_cluster.datasets import {loader}
    >>> bunch = {loader}(split="test", data_home="../shared/data")  # doctest: +SKIP
    >>> bunch.data.shape, bunch.images.shape, bunch.target.shape  # doctest: +SKIP
    ((10000, 784), (10000, 28, 28), (10000,))
    """


def load_mnist(split="test", data_home=None, return_X_y=False):
    return _load("mnist", split, data_home, return_X_y)


def load_fashion_mnist(split="test", data_home=None, return_X_y=False):
    return _load("fashion-mnist", split, data_home, return_X_y)


load_mnist.__doc__ = _LOAD_DOC.format(
    title="MNIST", name="handwritten digits", folder="mnist", fetcher="fetch_mnist",
    loader="load_mnist", how="``fetch_mnist(download=True)``",
)
load_fashion_mnist.__doc__ = _LOAD_DOC.format(
    title="Fashion-MNIST", name="article images", folder="fashion-mnist",
    fetcher="fetch_fashion_mnist", loader="load_fashion_mnist",
    how="``fetch_fashion_mnist(download=True)`` or ``apt-get install dataset-fashion-mnist``",
)


# ----------------------------------------------------------------------------------------------
# Downloads
# ----------------------------------------------------------------------------------------------


def _download_dir(dataset: str, data_home) -> Path:
    if data_home is not None:
        base = _as_path(data_home, "data_home")
    else:
        env = _env_dirs()
        base = env[0] if env else _home_dir()
    return base if base.name == dataset else base / dataset


def _mirrors(dataset: str, mirror) -> list[str]:
    if mirror is None:
        env = os.environ.get(MIRROR_ENV, "").split()
        mirrors = env or list(MIRRORS[dataset])
        name = f"${MIRROR_ENV}" if env else "MIRRORS"
    elif isinstance(mirror, str):
        mirrors, name = [mirror], "mirror"
    elif isinstance(mirror, (list, tuple)) and all(isinstance(m, str) for m in mirror):
        mirrors, name = list(mirror), "mirror"
    else:
        raise TypeError(f"mirror: expected None, a URL or a list of URLs, got {mirror!r}")
    if not mirrors:
        raise ValueError(f"{name}: expected at least one URL, got none")
    for m in mirrors:
        if urllib.parse.urlsplit(m).scheme not in ("http", "https", "ftp", "file"):
            raise ValueError(f"{name}: expected http(s)://, ftp:// or file:// URLs, got {m!r}")
    return mirrors


def _url(base: str, dataset: str, filename: str) -> str:
    return base.replace("{dataset}", dataset).rstrip("/") + "/" + filename


def _expected_md5(dataset: str, filename: str) -> tuple[str, ...]:
    known = CHECKSUMS.get(dataset, {}).get(filename)
    if not known:
        raise ValueError(f"no MD5 checksum is known for {dataset}/{filename} (see CHECKSUMS)")
    return (known,) if isinstance(known, str) else tuple(known)


def _download(dataset: str, filename: str, directory: Path, mirrors, timeout) -> Path:
    """Download ``filename`` into ``directory`` from the first mirror that serves it."""
    from .. import __version__

    expected = _expected_md5(dataset, filename)
    target = directory / filename
    errors = []
    for base in mirrors:
        url = _url(base, dataset, filename)
        request = urllib.request.Request(
            url, headers={"User-Agent": f"invariant_cluster/{__version__}"}
        )
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{filename}.", suffix=".part")
        try:
            md5 = hashlib.md5(usedforsecurity=False)
            with os.fdopen(fd, "wb") as out, urllib.request.urlopen(
                request, timeout=timeout
            ) as response:
                while chunk := response.read(1 << 20):
                    md5.update(chunk)
                    out.write(chunk)
            got = md5.hexdigest()
            if got not in expected:
                raise ValueError(
                    f"{filename}: checksum mismatch for the file downloaded from {url}: "
                    f"expected MD5 {' or '.join(expected)}, got {got}; the download was deleted"
                )
            os.replace(tmp, target)
            logger.info("downloaded %s to %s", url, target)
            return target
        except (OSError, HTTPException) as exc:
            # urllib.error.URLError / HTTPError and socket timeouts are OSErrors.
            errors.append(f"{url}: {exc}")
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    raise OSError(
        f"could not download {filename} into {directory}; tried:\n"
        + "\n".join(f"  - {e}" for e in errors)
        + f"\nPass mirror=... or set ${MIRROR_ENV} to a mirror that serves the file, or put "
        f"the file in {directory} yourself."
    )


def fetch_mnist(data_home=None, *, dataset="mnist", split="test", download=True, mirror=None,
                timeout=30, return_X_y=False):
    """Load MNIST or Fashion-MNIST, downloading the missing files first.

    Files already present anywhere in the search path (see the module's docstring) are not
    downloaded again. Each missing ``.gz`` file is streamed to a temporary file next to its
    destination, its MD5 checked against :data:`CHECKSUMS`, then renamed atomically, so an
    interrupted or corrupt download never leaves a file that a later load would read.

    Parameters
    ----------
    data_home : str or os.PathLike, default=None
        Where to search first and where to download to: into ``data_home/<dataset>/`` (or
        ``data_home`` itself if its name is the dataset's folder name). Default: the first
        directory of ``$INVARIANT_CLUSTER_DATA``, else ``~/invariant_cluster_data``.
    dataset : {"mnist", "fashion-mnist"}, default="mnist"
    split : {"train", "test", "all"}, default="test"
        Only the files of this split are fetched.
    download : bool, default=True
        If False, never download: behaves as :func:`load_mnist`.
    mirror : str or list of str, default=None
        Base URL(s) to download from, tried in order; the file name is appended and
        ``{dataset}`` is replaced by ``"mnist"`` resp. ``"fashion-mnist"``. Default: the
        whitespace-separated URLs in ``$INVARIANT_CLUSTER_MIRROR``, else :data:`MIRRORS`.
    timeout : float, default=30
        Seconds to wait for the server to answer (per connection attempt and read).
    return_X_y : bool, default=False
        Return ``(data, target)`` instead of a Bunch.

    Returns
    -------
    bunch : :class:`sklearn.utils.Bunch` or (data, target)
        As :func:`load_mnist` returns.

    Raises
    ------
    ValueError
        If an argument is invalid, or a downloaded file's MD5 checksum does not match (the
        message names the file and both checksums; the download is deleted).
    OSError
        If no mirror serves a missing file (HTTP error, no connection, timeout); the message
        lists each URL tried and its error.
    FileNotFoundError
        If ``download=False`` and a file is missing.

    See Also
    --------
    fetch_fashion_mnist : The same with ``dataset="fashion-mnist"``.
    load_mnist : Load from local files only.

    Examples
    --------
    >>> from invariant_cluster.datasets import fetch_mnist
    >>> X, y = fetch_mnist(split="test", return_X_y=True)  # doctest: +SKIP
    >>> X.shape, y.shape  # doctest: +SKIP
    ((10000, 784), (10000,))
    """
    dataset = _check_dataset(dataset)
    parts = _check_split(split)
    if not isinstance(download, (bool, np.bool_)):
        raise TypeError(f"download: expected a bool, got {download!r}")
    if timeout is not None and (
        not isinstance(timeout, numbers.Real) or isinstance(timeout, bool)
        or not math.isfinite(timeout) or timeout <= 0
    ):
        raise ValueError(f"timeout: expected a positive number of seconds or None, got {timeout!r}")
    if download:
        mirrors = _mirrors(dataset, mirror)
        dirs = _search_dirs(dataset, data_home)
        missing = [stem for part in parts for stem in _SPLIT_FILES[part]
                   if _find(dirs, stem) is None]
        if missing:
            directory = _download_dir(dataset, data_home)
            directory.mkdir(parents=True, exist_ok=True)
            for stem in missing:
                _download(dataset, stem + ".gz", directory, mirrors, timeout)
    return _load(dataset, split, data_home, return_X_y)


def fetch_fashion_mnist(data_home=None, *, split="test", download=True, mirror=None, timeout=30,
                        return_X_y=False):
    """Load Fashion-MNIST, downloading the missing files first.

    The same as :func:`fetch_mnist` with ``dataset="fashion-mnist"``; see there for the
    parameters, return value and errors. On Debian/Ubuntu, ``apt-get install
    dataset-fashion-mnist`` provides the files without a download.

    Examples
    --------
    >>> from invariant_cluster.datasets import fetch_fashion_mnist
    >>> bunch = fetch_fashion_mnist(split="all")  # doctest: +SKIP
    >>> bunch.data.shape, list(bunch.target_names[:2])  # doctest: +SKIP
    ((70000, 784), ['T-shirt/top', 'Trouser'])
    """
    return fetch_mnist(data_home, dataset="fashion-mnist", split=split, download=download,
                       mirror=mirror, timeout=timeout, return_X_y=return_X_y)

