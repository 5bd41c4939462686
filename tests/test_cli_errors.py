"""The command line keeps its promises on bad input and on its output folder: exit status 2 and
one line for unreadable or overflowing input, ``--out`` checked before the fit, no file of an
earlier run left beside the new ones."""

import os
import zipfile

import numpy as np
import pytest
from _cli import assert_usage_error, call
from _images import random_images

from invariant_cluster import InvariantAttentionClusterer, InvariantKNeighborsTransformer

pytestmark = pytest.mark.usefixtures("torch_single_thread")

FIT_FILES = ["alignments.csv", "centers.npy", "centers.png", "labels.csv", "shapes.png"]


@pytest.fixture
def images(tmp_path):
    """Eight random 10 x 10 images and their labels as .npy files."""
    X = random_images((8, 10, 10), seed=5, border=2).astype(np.float32)
    np.save(tmp_path / "x.npy", X)
    np.save(tmp_path / "y.npy", np.arange(8) % 2)
    return X, tmp_path / "x.npy"


def _corrupt(tmp_path, kind):
    """A file that NumPy's or zipfile's parsers fail on, each in its own way."""
    good = tmp_path / "good.npy"
    np.save(good, np.zeros((6, 8, 8), np.float32))
    raw = good.read_bytes()
    if kind == "npz cut in half":
        np.savez(tmp_path / "full.npz", X=np.zeros((6, 8, 8)))
        data = (tmp_path / "full.npz").read_bytes()
        path, content = tmp_path / "bad.npz", data[: len(data) // 2]
    elif kind == "npz member not an array":
        path = tmp_path / "member.npz"
        with zipfile.ZipFile(path, "w") as z:
            z.writestr("X.npy", b"\x93NUMPY\x01\x00{'descr': '<f4', 'sha")
        return path
    elif kind == "npy header broken":
        path, content = tmp_path / "header.npy", raw[:10] + b"{'descr': '<f4', (" + raw[40:]
    elif kind == "npy data truncated":
        path, content = tmp_path / "short.npy", raw[: len(raw) - 40]
    else:  # a header that announces 256 TB
        path = tmp_path / "huge.npy"
        with open(path, "wb") as f:
            np.lib.format.write_array_header_1_0(
                f, {"descr": "<f4", "fortran_order": False, "shape": (10**12, 8, 8)})
            f.write(raw[-64:])
        return path
    path.write_bytes(content)
    return path


KINDS = ["npz cut in half", "npz member not an array", "npy header broken",
         "npy data truncated", "npy header shape"]


@pytest.mark.parametrize("command", ["fit", "neighbors"])
@pytest.mark.parametrize("kind", KINDS)
def test_corrupt_input_is_one_line(tmp_path, capsys, command, kind):
    path = _corrupt(tmp_path, kind)
    proc = call(capsys, command, path, "--out", tmp_path / "out")
    assert_usage_error(proc, path.name)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("kind", KINDS[:3])
def test_corrupt_labels_are_one_line(tmp_path, capsys, images, kind):
    path = _corrupt(tmp_path, kind)
    proc = call(capsys, "fit", images[1], "--labels", path, "--out", tmp_path / "out")
    assert_usage_error(proc, "--labels", path.name)


def test_second_run_leaves_no_stale_files(tmp_path, capsys, images):
    X, path = images
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("the user's own file")
    labelled = call(capsys, "fit", path, "--labels", tmp_path / "y.npy", "--device", "cpu",
                    "--out", out)
    assert labelled.returncode == 0, labelled.stderr
    assert sorted(p.name for p in out.iterdir()) == sorted(FIT_FILES + ["metrics.json",
                                                                        "notes.txt"])
    # the same images without labels: no metrics.json may remain to contradict labels.csv
    again = call(capsys, "fit", path, "--device", "cpu", "--out", out, "--n-samples", "6")
    assert again.returncode == 0, again.stderr
    assert sorted(p.name for p in out.iterdir()) == sorted(FIT_FILES + ["notes.txt"])
    assert (out / "labels.csv").read_text().splitlines()[0] == "index,label,shape"
    assert len((out / "labels.csv").read_text().splitlines()) == 1 + 6
    assert (out / "notes.txt").read_text() == "the user's own file"


def _refuse_fit(self, *args, **kwargs):
    raise AssertionError("the fit ran although --out cannot be written")


@pytest.mark.parametrize("command, estimator", [
    ("fit", InvariantAttentionClusterer),
    ("neighbors", InvariantKNeighborsTransformer),
    ("class-averages", InvariantAttentionClusterer),
])
def test_unwritable_out_is_found_before_the_fit(tmp_path, capsys, monkeypatch, images,
                                               command, estimator):
    monkeypatch.setattr(estimator, "fit", _refuse_fit)
    pytest.importorskip("mrcfile")  # class-averages needs it before anything else
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    targets = [blocker, blocker / "sub"]
    if os.geteuid() != 0:  # root writes into a read-only folder anyway
        locked = tmp_path / "locked"
        locked.mkdir()
        locked.chmod(0o500)
        targets.append(locked)
    for out in targets:
        assert_usage_error(call(capsys, command, images[1], "--out", out), "--out", str(out))


@pytest.mark.parametrize("values, fragment", [
    (np.float32(1e20), "overflow"),
    (np.float32(3e38), "overflow"),
    (np.float64(1e300), "overflow"),
])
def test_values_that_overflow_are_refused(tmp_path, capsys, images, values, fragment):
    X = images[0]
    path = tmp_path / "huge.npy"
    np.save(path, X.astype(values.dtype) * values)
    for command in ("fit", "neighbors"):
        proc = call(capsys, command, path, "--out", tmp_path / "out")
        assert_usage_error(proc, "huge.npy", fragment)
    assert not (tmp_path / "out").exists()


def test_non_finite_results_are_not_written(tmp_path, capsys, monkeypatch, images):
    real_fit = InvariantAttentionClusterer.fit

    def fit_gone_wrong(self, X, y=None):
        real_fit(self, X)
        self.invariant_means_ = np.full_like(self.invariant_means_, np.nan)
        return self

    monkeypatch.setattr(InvariantAttentionClusterer, "fit", fit_gone_wrong)
    out = tmp_path / "out"
    proc = call(capsys, "fit", images[1], "--device", "cpu", "--out", out)
    assert proc.returncode == 1
    assert len(proc.stderr.strip().splitlines()) == 1 and "non-finite" in proc.stderr
    assert list(out.iterdir()) == []


def test_bad_run_keeps_the_earlier_results(tmp_path, capsys, images):
    """A run that fails on its input removes nothing: the earlier run's folder stays whole."""
    out = tmp_path / "out"
    first = call(capsys, "fit", images[1], "--device", "cpu", "--out", out)
    assert first.returncode == 0, first.stderr
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert_usage_error(call(capsys, "fit", _corrupt(tmp_path, "npz cut in half"), "--out", out),
                       "bad.npz")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(before) == FIT_FILES


@pytest.mark.parametrize("command", ["fit", "neighbors", "class-averages"])
@pytest.mark.parametrize("out", ["", "  "])
def test_empty_out_is_refused_and_nothing_is_overwritten(tmp_path, capsys, monkeypatch, images,
                                                         command, out):
    """``--out "$OUTDIR"`` with the variable unset must not write into the current folder."""
    if command == "class-averages":
        pytest.importorskip("mrcfile")
    monkeypatch.chdir(tmp_path)
    for name in FIT_FILES:
        (tmp_path / name).write_text("the user's own file")
    assert_usage_error(call(capsys, command, images[1], "--out", out), "--out", "empty")
    for name in FIT_FILES:
        assert (tmp_path / name).read_text() == "the user's own file"
