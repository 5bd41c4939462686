"""The command line, run as a user runs it: ``python -m invariant_cluster ...`` in a subprocess."""

import csv
import gzip
import json
import os
import struct
import subprocess
import sys

import numpy as np
import pytest
from _cli import assert_usage_error, call
from _images import t_and_box

from invariant_cluster import warp_se2


def run(*args, cwd=None, timeout=120):
    env = dict(os.environ, MPLBACKEND="Agg")
    return subprocess.run([sys.executable, "-m", "invariant_cluster", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout)


@pytest.fixture(scope="module")
def quarter_turns(tmp_path_factory):
    """Quarter-turn copies of a T (6) and a box (4) as .npy images plus labels."""
    t, box = t_and_box()
    angles = np.array([0, 90, 180, 270, 90, 180, 0, 90, 180, 270], dtype=np.float32)
    X = warp_se2(np.stack([t] * 6 + [box] * 4), np.c_[angles, np.zeros((10, 2), np.float32)])
    y = np.array([0] * 6 + [1] * 4)
    d = tmp_path_factory.mktemp("data")
    np.save(d / "x.npy", X)
    np.save(d / "y.npy", y)
    return d, X, y, angles


FAST = ["--group", "rotation", "--n-rotations", "4", "--n-neighbors", "4", "--max-iter", "10",
        "--device", "cpu"]


class TestFit:
    def test_npy_with_labels(self, quarter_turns, tmp_path):
        d, X, y, angles = quarter_turns
        out = tmp_path / "out"
        proc = run("fit", d / "x.npy", "--labels", d / "y.npy", "--n-clusters", "2", *FAST,
                   "--out", out)
        assert proc.returncode == 0, proc.stderr
        assert "Traceback" not in proc.stderr
        assert "10 images -> 2 clusters" in proc.stdout
        assert sorted(p.name for p in out.iterdir()) == [
            "alignments.csv", "centers.npy", "centers.png", "labels.csv", "metrics.json",
            "shapes.png"]
        with open(out / "labels.csv") as f:
            rows = list(csv.DictReader(f))
        assert [int(r["index"]) for r in rows] == list(range(10))
        labels = np.array([int(r["label"]) for r in rows])
        assert len(set(labels[:6])) == 1 and len(set(labels[6:])) == 1
        assert labels[0] != labels[6]
        assert [int(r["true_label"]) for r in rows] == list(y)
        # each image's shape: the group of copies it belongs to, one cluster per shape
        shapes = np.array([int(r["shape"]) for r in rows])
        for s in np.unique(shapes):
            assert len(set(labels[shapes == s])) == 1
        with open(out / "alignments.csv") as f:
            al = list(csv.DictReader(f))
        assert list(al[0]) == ["index", "label", "angle_deg", "tx_px", "ty_px"]
        # copies of one shape differ by quarter turns, so do their alignments (mod 360)
        a = np.array([float(r["angle_deg"]) for r in al])
        rel = (a[:6] - a[0] + angles[:6] - angles[0]) % 90
        assert np.all(np.minimum(rel, 90 - rel) < 1.0)
        m = json.loads((out / "metrics.json").read_text())
        assert m["ACC"] == 1.0 and m["ARI"] == 1.0 and m["NMI"] == pytest.approx(1.0)
        assert m["n_samples"] == 10 and m["n_clusters"] == 2
        assert np.load(out / "centers.npy").shape == (2, 1, 11, 11)
        assert (out / "centers.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    def test_npz_idx_and_folder(self, quarter_turns, tmp_path, capsys):
        from PIL import Image

        d, X, y, _ = quarter_turns
        # .npz with X and y: metrics without --labels
        np.savez(tmp_path / "d.npz", X=X, y=y)
        # IDX (gzip'd) images and labels, as MNIST ships them
        u8 = np.round(np.clip(X, 0, 1) * 255).astype(np.uint8)
        header = bytes([0, 0, 0x08, 3]) + struct.pack(">III", *u8.shape)
        (tmp_path / "img-idx3-ubyte.gz").write_bytes(gzip.compress(header + u8.tobytes()))
        lab = bytes([0, 0, 0x08, 1]) + struct.pack(">I", 10) + y.astype(np.uint8).tobytes()
        (tmp_path / "lab-idx1-ubyte").write_bytes(lab)
        # a folder of PNGs
        folder = tmp_path / "pngs"
        folder.mkdir()
        for i, im in enumerate(u8):
            Image.fromarray(im).save(folder / f"im{i:02d}.png")
        for inp, extra in ((tmp_path / "d.npz", []),
                           (tmp_path / "img-idx3-ubyte.gz",
                            ["--labels", tmp_path / "lab-idx1-ubyte"]),
                           (folder, [])):
            out = tmp_path / ("out_" + inp.name)
            proc = call(capsys, "fit", inp, *extra, "--n-clusters", "2", *FAST, "--out", out)
            assert proc.returncode == 0, proc.stderr
            with open(out / "labels.csv") as f:
                rows = list(csv.DictReader(f))
            labels = [int(r["label"]) for r in rows]
            assert len(set(labels[:6])) == 1 and len(set(labels[6:])) == 1
            if inp == folder:
                assert rows[0]["file"] == "im00.png"
                assert not (out / "metrics.json").exists()
            else:
                assert json.loads((out / "metrics.json").read_text())["ARI"] == 1.0

    def test_folder_of_different_sizes(self, tmp_path, capsys):
        # dark discs and dark bars on white, each at four sizes (wide, tall, large, square) and
        # the square bars turned by quarter turns: --image-size brings them to one square,
        # --invert makes the objects bright on 0, and the two shapes are the two clusters
        from PIL import Image

        folder = tmp_path / "photos"
        folder.mkdir()
        sizes = [(48, 60), (100, 80), (341, 300), (60, 60)]
        for i, (h, w) in enumerate(sizes):
            yy, xx = np.mgrid[:h, :w]
            cy, cx, r = (h - 1) / 2, (w - 1) / 2, min(h, w) / 3
            disc = (yy - cy) ** 2 + (xx - cx) ** 2 <= r ** 2
            bar = (np.abs(yy - cy) <= r / 4) & (np.abs(xx - cx) <= r)
            for name, shape in (("disc", disc), ("bar", np.rot90(bar, i % 2) if h == w
                                                  else bar)):
                Image.fromarray(np.where(shape, 30, 250).astype(np.uint8)).save(
                    folder / f"{name}{i}.png")
        out = tmp_path / "out"
        proc = call(capsys, "fit", folder, "--image-size", "16", "--invert", "--n-clusters",
                    "2", *FAST, "--out", out)
        assert proc.returncode == 0, proc.stderr
        assert "8 images -> 2 clusters" in proc.stdout
        assert np.load(out / "centers.npy").shape == (2, 1, 16, 16)
        with open(out / "labels.csv") as f:
            rows = {r["file"]: int(r["label"]) for r in csv.DictReader(f)}
        assert sorted(rows) == sorted(p.name for p in folder.iterdir())
        discs = {v for k, v in rows.items() if k.startswith("disc")}
        bars = {v for k, v in rows.items() if k.startswith("bar")}
        assert len(discs) == 1 and len(bars) == 1 and discs != bars
        # bright objects on a zero background: the centres' corners are 0
        centers = np.load(out / "centers.npy")
        assert np.abs(centers[:, 0, 0, 0]).max() < 0.05 and centers.max() > 0.5

    def test_bad_argument_subprocess(self, quarter_turns):
        d = quarter_turns[0]
        assert_usage_error(run("fit", d / "x.npy", "--n-clusters", "zero"), "--n-clusters")

    def test_unreadable_file_subprocess(self, tmp_path):
        (tmp_path / "junk.npy").write_bytes(b"not an array")
        assert_usage_error(run("fit", tmp_path / "junk.npy"), "junk.npy")

    @pytest.mark.parametrize("args, fragment", [
        (["--group", "affine"], "--group"),
        (["--max-rotation", "400"], "--max-rotation"),
        (["--bandwidth", "-1"], "--bandwidth"),
        (["--noise-std", "-0.5"], "--noise-std"),
        (["--noise-std", "loud"], "--noise-std"),
        (["--n-neighbors", "0"], "--n-neighbors"),
        (["--image-shape", "4"], "--image-shape"),
    ])
    def test_bad_arguments(self, quarter_turns, capsys, args, fragment):
        d = quarter_turns[0]
        assert_usage_error(call(capsys, "fit", d / "x.npy", *args), fragment)

    def test_missing_command_or_input(self, capsys):
        assert_usage_error(call(capsys, "fit"), "INPUT")
        assert_usage_error(call(capsys, "cluster"), "invalid choice")
        assert_usage_error(call(capsys), "COMMAND")

    def test_bad_values_found_while_fitting(self, quarter_turns, capsys):
        d = quarter_turns[0]
        # more clusters than images: the estimator's ValueError, reported as one line
        assert_usage_error(call(capsys, "fit", d / "x.npy", "--n-clusters", "50", *FAST),
                           "n_clusters")
        assert_usage_error(call(capsys, "fit", d / "x.npy", *FAST[:-1], "gpu7"), "device")

    def test_unreadable_input(self, tmp_path, capsys):
        assert_usage_error(call(capsys, "fit", tmp_path / "missing.npy"), "no such file")
        (tmp_path / "junk-idx3-ubyte").write_bytes(b"\x00\x00\x08\x03\x00")
        assert_usage_error(call(capsys, "fit", tmp_path / "junk-idx3-ubyte"), "junk-idx3-ubyte")
        (tmp_path / "junk.npz").write_bytes(b"PK broken")
        assert_usage_error(call(capsys, "fit", tmp_path / "junk.npz"), "junk.npz")
        np.savez(tmp_path / "k.npz", images2=np.zeros((3, 4, 4)))
        assert_usage_error(call(capsys, "fit", tmp_path / "k.npz"), "'X' or 'data'")
        np.save(tmp_path / "rows.npy", np.zeros((5, 10)))
        assert_usage_error(call(capsys, "fit", tmp_path / "rows.npy"), "--image-shape")
        np.save(tmp_path / "nan.npy", np.full((5, 4, 4), np.nan))
        assert_usage_error(call(capsys, "fit", tmp_path / "nan.npy"), "NaN")
        np.save(tmp_path / "one.npy", np.zeros((1, 4, 4)))
        assert_usage_error(call(capsys, "fit", tmp_path / "one.npy"), "at least 2")
        np.save(tmp_path / "ok.npy", np.zeros((5, 4, 4)))
        np.save(tmp_path / "y3.npy", np.zeros(3))
        assert_usage_error(
            call(capsys, "fit", tmp_path / "ok.npy", "--labels", tmp_path / "y3.npy"), "labels")
        (tmp_path / "bad.npy").write_bytes(b"xx")
        assert_usage_error(
            call(capsys, "fit", tmp_path / "ok.npy", "--labels", tmp_path / "bad.npy"),
            "--labels")

    def test_folder_errors(self, tmp_path, capsys):
        from PIL import Image

        empty = tmp_path / "empty"
        empty.mkdir()
        assert_usage_error(call(capsys, "fit", empty), "no images", "*.png")
        mixed = tmp_path / "mixed"
        mixed.mkdir()
        Image.fromarray(np.zeros((8, 8), np.uint8)).save(mixed / "a.png")
        Image.fromarray(np.zeros((9, 8), np.uint8)).save(mixed / "b.png")
        assert_usage_error(call(capsys, "fit", mixed), "same size", "a.png", "b.png",
                           "--image-size")
        # --image-size and --invert read folders only, and the size is at least 2
        np.save(tmp_path / "x.npy", np.zeros((4, 8, 8), np.float32))
        assert_usage_error(call(capsys, "fit", tmp_path / "x.npy", "--image-size", "8"),
                           "--image-size", "folder")
        assert_usage_error(call(capsys, "fit", tmp_path / "x.npy", "--invert"),
                           "--invert", "folder")
        assert_usage_error(call(capsys, "fit", mixed, "--image-size", "1"), "--image-size",
                           "an integer >= 2")
        (mixed / "b.png").write_bytes(b"broken")
        assert_usage_error(call(capsys, "fit", mixed), "b.png")

    def test_image_shape_folds_rows(self, quarter_turns, tmp_path, capsys):
        d, X, _, _ = quarter_turns
        np.save(tmp_path / "rows.npy", X.reshape(10, -1)[:, :110])  # 10 x 11 images
        proc = call(capsys, "fit", tmp_path / "rows.npy", "--image-shape", "10", "11",
                    "--n-clusters", "2", *FAST, "--out", tmp_path / "o", "--n-samples", "8")
        assert proc.returncode == 0, proc.stderr
        assert np.load(tmp_path / "o" / "centers.npy").shape[1:] == (1, 10, 11)
        assert "8 images" in proc.stdout


class TestDemo:
    def test_tiny_demo(self, tmp_path):
        out = tmp_path / "demo"
        proc = run("demo", "--n-samples", "60", "--n-rotations", "9", "--max-iter", "8",
                   "--device", "cpu", "--out", out)
        assert proc.returncode == 0, proc.stderr
        assert "Traceback" not in proc.stderr
        for method in ("k-means (pixels)", "kernel attention", "invariant attention"):
            assert method in proc.stdout
        header = next(line for line in proc.stdout.splitlines() if line.startswith("method"))
        assert header.split() == ["method", "ACC", "ARI", "NMI", "seconds"]
        m = json.loads((out / "demo.json").read_text())
        assert m["n_samples"] == 60 and m["max_rotation"] == 45.0
        assert [r["method"] for r in m["results"]] == [
            "k-means (pixels)", "kernel attention", "invariant attention"]
        for r in m["results"]:
            assert 0 <= r["ACC"] <= 1 and -1 <= r["ARI"] <= 1 and r["seconds"] >= 0
        assert (out / "invariant_means.png").read_bytes()[:4] == b"\x89PNG"

    def test_demo_errors(self, tmp_path, capsys, monkeypatch):
        # an empty --data folder, and none of the loader's other folders to fall back on
        from invariant_cluster.datasets import _mnist

        monkeypatch.delenv(_mnist.DATA_ENV, raising=False)
        monkeypatch.setattr(_mnist, "_home_dir", lambda: tmp_path / "home")
        monkeypatch.setattr(_mnist, "_SYSTEM_DATA_DIR", tmp_path / "system")
        assert_usage_error(call(capsys, "demo", "--n-samples", "5000"), "--n-samples")
        assert_usage_error(call(capsys, "demo", "--data", tmp_path), "--data", "MNIST")
        assert_usage_error(call(capsys, "demo", "--max-rotation", "-3"), "--max-rotation")


class TestHelp:
    def test_help_subprocess(self):
        proc = run("--help")
        assert proc.returncode == 0
        assert "usage: invariant-cluster" in proc.stdout and "examples:" in proc.stdout

    @pytest.mark.parametrize("command", ["fit", "demo", "neighbors", "class-averages"])
    def test_command_help(self, capsys, command):
        proc = call(capsys, command, "--help")
        assert proc.returncode == 0
        assert f"usage: invariant-cluster {command}" in proc.stdout
        assert "examples:" in proc.stdout

    def test_version(self, capsys):
        from invariant_cluster import __version__

        proc = call(capsys, "--version")
        assert proc.returncode == 0 and __version__ in proc.stdout

    def test_import_is_light(self):
        code = ("import sys, invariant_cluster.cli as c; c.build_parser(); "
                "print(any(m in sys.modules for m in ('torch', 'numpy', 'kornia')))")
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert proc.stdout.strip() == "False", proc.stderr


@pytest.mark.parametrize("given, expected", [([], None), (["--noise-std", "auto"], "auto"),
                                             (["--noise-std", "0"], 0.0),
                                             (["--noise-std", "0.25"], 0.25)])
def test_noise_std_reaches_the_estimator(given, expected):
    from invariant_cluster.cli import _estimator_params, build_parser

    args = build_parser().parse_args(["fit", "x.npy", *given])
    params = _estimator_params(args)
    # not given: the estimator's own default ("auto") applies
    assert params.get("noise_std") == expected


def test_uint8_input_is_read_as_the_python_api_reads_it(tmp_path, capsys):
    """One rule for integer pixels: the command line passes them at their values, as the
    estimators take them, so a fit from a uint8 file equals the Python fit of the array."""
    from invariant_cluster import InvariantAttentionClusterer

    rng = np.random.default_rng(7)
    X = (rng.random((12, 9, 9)) * 255).astype(np.uint8)
    np.save(tmp_path / "u8.npy", X)
    out = tmp_path / "out"
    proc = call(capsys, "fit", tmp_path / "u8.npy", "--n-clusters", "2", "--n-rotations", "4",
                "--out", out)
    assert proc.returncode == 0, proc.stderr
    est = InvariantAttentionClusterer(n_clusters=2, n_rotations=4, random_state=0).fit(X)
    centers = np.load(out / "centers.npy").reshape(est.cluster_centers_.shape)
    # the centres of a fit in 0..255 are in 0..255 (divided by 255 they would be below 1)
    assert centers.max() > 1.0
    np.testing.assert_allclose(centers, est.cluster_centers_, rtol=1e-4, atol=1e-3)


def test_fit_center(tmp_path, capsys):
    # copies shifted within +-3 px, searched within +-1 px once centred on their centres of mass
    from _images import shifted_digit_copies

    X, y = shifted_digit_copies(4, 3, 3, seed=0)
    np.save(tmp_path / "x.npy", X)
    np.save(tmp_path / "y.npy", y)
    out = tmp_path / "out"
    proc = call(capsys, "fit", tmp_path / "x.npy", "--labels", tmp_path / "y.npy",
                "--max-translation", "1", "--center", "--device", "cpu", "--out", out)
    assert proc.returncode == 0, proc.stderr
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["ARI"] == 1.0
