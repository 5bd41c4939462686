"""MRC image stacks: :func:`invariant_cluster.datasets.load_mrc` on files written here with
``mrcfile``, and the command line on them (``fit``, ``neighbors``, ``class-averages``)."""

import csv
import json
import sys

import numpy as np
import pytest
from _cli import assert_usage_error, call
from _images import random_images

from invariant_cluster import InvariantAttentionClusterer
from invariant_cluster.datasets import load_mrc

mrcfile = pytest.importorskip("mrcfile")

pytestmark = pytest.mark.usefixtures("torch_single_thread")


def write(path, data, *, kind="stack", voxel_size=None):
    with mrcfile.new(path, overwrite=True) as mrc:
        mrc.set_data(data)
        if kind == "stack":
            mrc.set_image_stack()
        elif kind == "volume":
            mrc.set_volume()
        if voxel_size is not None:
            mrc.voxel_size = voxel_size
    return path


class TestLoadMrc:
    @pytest.mark.parametrize("dtype, shape", [
        (np.float32, (5, 7, 9)),
        (np.int16, (3, 12, 12)),
        (np.int8, (4, 6, 5)),
        (np.uint16, (2, 8, 8)),
        (np.float16, (6, 4, 10)),
    ])
    def test_reads_the_stack_exactly(self, tmp_path, dtype, shape):
        rng = np.random.default_rng(sum(shape))
        data = (rng.random(shape) * 100 - (50 if np.dtype(dtype).kind != "u" else 0))
        data = data.astype(dtype)
        for suffix in (".mrcs", ".mrc"):
            images = load_mrc(write(tmp_path / f"s{suffix}", data))
            assert images.dtype == np.float32 and images.shape == shape
            np.testing.assert_array_equal(images, data.astype(np.float32))

    def test_voxel_size_and_single_image(self, tmp_path):
        data = random_images((3, 6, 8), seed=1).astype(np.float32)
        images, voxel = load_mrc(write(tmp_path / "v.mrcs", data, voxel_size=(1.5, 1.5, 2.0)),
                                 return_voxel_size=True)
        np.testing.assert_array_equal(images, data)
        assert voxel == pytest.approx((1.5, 1.5, 2.0))
        single = load_mrc(write(tmp_path / "one.mrc", data[0], kind=None))
        assert single.shape == (1, 6, 8)
        np.testing.assert_array_equal(single[0], data[0])

    def test_volume_is_refused_where_a_stack_is_expected(self, tmp_path):
        data = random_images((4, 6, 6), seed=2).astype(np.float32)
        path = write(tmp_path / "map.mrc", data, kind="volume")
        with pytest.raises(ValueError, match="map.mrc.*volume of 4 sections"):
            load_mrc(path)
        # the suffix .mrcs declares a stack, whatever the space group says
        np.testing.assert_array_equal(
            load_mrc(write(tmp_path / "old.mrcs", data, kind="volume")), data)

    def test_truncated_and_not_mrc(self, tmp_path):
        path = write(tmp_path / "t.mrcs", np.ones((5, 8, 8), np.float32))
        path.write_bytes(path.read_bytes()[:-100])
        with pytest.raises(ValueError, match="t.mrcs.*truncated"):
            load_mrc(path)
        (tmp_path / "text.mrc").write_bytes(b"hello")
        with pytest.raises(ValueError, match="text.mrc"):
            load_mrc(tmp_path / "text.mrc")
        with pytest.raises(FileNotFoundError, match="missing.mrcs"):
            load_mrc(tmp_path / "missing.mrcs")
        with pytest.raises(TypeError, match="path"):
            load_mrc(3)

    def test_unsupported_modes(self, tmp_path):
        complex_path = write(tmp_path / "c.mrcs", np.ones((3, 4, 4), np.complex64))
        with pytest.raises(ValueError, match="c.mrcs: unsupported MRC mode 4"):
            load_mrc(complex_path)
        # mode 3 (complex int16) and an unknown mode, written into a good file's header
        raw = bytearray(write(tmp_path / "good.mrcs", np.ones((3, 4, 4), np.float32))
                        .read_bytes())
        for mode in (3, 7):
            raw[12:16] = np.int32(mode).tobytes()
            (tmp_path / f"m{mode}.mrcs").write_bytes(bytes(raw))
            with pytest.raises(ValueError, match=f"m{mode}.mrcs: unsupported MRC mode"):
                load_mrc(tmp_path / f"m{mode}.mrcs")

    def test_nan_is_refused(self, tmp_path):
        data = np.zeros((3, 4, 4), np.float32)
        data[1, 2, 2] = np.nan
        with pytest.warns(RuntimeWarning, match="NaN"):  # mrcfile's, on writing
            path = write(tmp_path / "nan.mrcs", data)
        with pytest.raises(ValueError, match="nan.mrcs: contains NaN"):
            load_mrc(path)

    @pytest.mark.parametrize("blank, missing", [
        ((208, 216), "no 'MAP ' ID string and no machine stamp"),
        ((208, 212), "no 'MAP ' ID string"),
        ((212, 216), "no machine stamp"),
    ])
    def test_header_without_id_or_stamp(self, tmp_path, blank, missing):
        # as older programs write it (RELION and cryoDRGN read it): read, with a warning
        from invariant_cluster.datasets import mrc_voxel_size

        data = random_images((5, 6, 8), seed=4).astype(np.float32)
        raw = bytearray(write(tmp_path / "s.mrcs", data, voxel_size=2.0).read_bytes())
        raw[blank[0]:blank[1]] = bytes(blank[1] - blank[0])
        path = tmp_path / "old.mrcs"
        path.write_bytes(bytes(raw))
        with pytest.warns(RuntimeWarning, match=f"old.mrcs: the MRC header has {missing} "):
            images = load_mrc(path)
        np.testing.assert_array_equal(images, data)
        with pytest.warns(RuntimeWarning, match=missing):
            assert mrc_voxel_size(path) == pytest.approx((2.0, 2.0, 2.0))
        # a short or unknown-mode file without the ID is still refused
        path.write_bytes(bytes(raw[:-10]))
        with pytest.raises(ValueError, match="old.mrcs: cannot read it.*truncated"):
            load_mrc(path)
        raw[12:16] = np.int32(7).tobytes()
        path.write_bytes(bytes(raw))
        with pytest.raises(ValueError, match="old.mrcs: unsupported MRC mode"):
            load_mrc(path)

    def test_as_stack(self, tmp_path):
        data = random_images((4, 6, 6), seed=2).astype(np.float32)
        path = write(tmp_path / "stack.mrc", data, kind="volume")
        with pytest.raises(ValueError, match="volume of 4 sections.*as_stack=True"):
            load_mrc(path)
        np.testing.assert_array_equal(load_mrc(path, as_stack=True), data)
        with pytest.raises(TypeError, match="as_stack: expected a bool"):
            load_mrc(path, as_stack="yes")
        with pytest.raises(IsADirectoryError, match="a folder"):
            load_mrc(tmp_path)

    def test_without_mrcfile(self, tmp_path, capsys, monkeypatch):
        path = write(tmp_path / "s.mrcs", np.ones((3, 4, 4), np.float32))
        monkeypatch.setitem(sys.modules, "mrcfile", None)  # "import mrcfile" fails
        with pytest.raises(ImportError, match=r"pip install invariant_cluster\[mrc\]"):
            load_mrc(path)
        for command in ("fit", "class-averages"):
            assert_usage_error(call(capsys, command, path, "--out", tmp_path / "o"),
                               "invariant_cluster[mrc]")


@pytest.fixture
def particles(tmp_path):
    """Twelve noisy 16 x 16 images: six exact quarter turns of each of two random images."""
    Y = random_images((2, 16, 16), seed=3, border=4).astype(np.float32)
    clean = np.concatenate([np.rot90(Y, k=k % 4, axes=(1, 2)) for k in range(6)])
    noisy = clean + 0.05 * np.random.default_rng(0).standard_normal(clean.shape)
    path = write(tmp_path / "particles.mrcs", noisy.astype(np.float32),
                 voxel_size=(1.5, 1.5, 1.5))
    return clean, noisy.astype(np.float32), path


def _labels(path):
    with open(path) as f:
        return np.array([int(r["label"]) for r in csv.DictReader(f)])


def test_fit_and_neighbors_read_mrcs(tmp_path, capsys, particles):
    _, _, path = particles
    fit = call(capsys, "fit", path, "--device", "cpu", "--n-clusters", "2", "--out",
               tmp_path / "fit")
    assert fit.returncode == 0, fit.stderr
    labels = _labels(tmp_path / "fit" / "labels.csv")
    assert len(set(labels[0::2])) == 1 and len(set(labels[1::2])) == 1  # copies together
    assert labels[0] != labels[1]
    knn = call(capsys, "neighbors", path, "--device", "cpu", "--out", tmp_path / "knn")
    assert knn.returncode == 0, knn.stderr
    ind = np.load(tmp_path / "knn" / "indices.npy")
    assert ind.shape == (12, 6)
    assert np.all(ind[:, 0] == np.arange(12))
    assert np.all(ind[:, 1] % 2 == np.arange(12) % 2)  # the nearest other is a copy


def test_class_averages(tmp_path, capsys, particles):
    clean, noisy, path = particles
    out = tmp_path / "averages"
    # the copies are np.rot90 turns, about the geometric centre; an MRC stack's default is the
    # field's centre, pixel (8, 8)
    proc = call(capsys, "class-averages", path, "--device", "cpu", "--out", out,
                "--rotation-center", "geometric")
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in out.iterdir()) == [
        "class_averages.json", "class_averages.mrcs", "class_labels.csv"]
    with mrcfile.open(out / "class_averages.mrcs") as mrc:
        assert mrc.is_image_stack()
        assert mrc.voxel_size.item() == pytest.approx((1.5, 1.5, 1.5))
        averages = np.array(mrc.data)
    assert averages.dtype == np.float32 and averages.shape == (12, 16, 16)
    # the estimator's invariant means, in each image's own pose, in the input's order
    est = InvariantAttentionClusterer(random_state=0, device="cpu").fit(noisy)
    np.testing.assert_allclose(averages, est.invariant_means_.reshape(12, 16, 16),
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(_labels(out / "class_labels.csv"), est.labels_)
    # a class average is a denoised image: nearer the clean image than the noisy one is
    err_avg = np.linalg.norm((averages - clean).reshape(12, -1), axis=1)
    err_noisy = np.linalg.norm((noisy - clean).reshape(12, -1), axis=1)
    assert np.all(err_avg < 0.8 * err_noisy), (err_avg, err_noisy)
    info = json.loads((out / "class_averages.json").read_text())
    assert info["n_images"] == 12 and info["image_shape"] == [16, 16]
    assert info["voxel_size"] == pytest.approx([1.5, 1.5, 1.5])
    assert info["rotation_center"] == "geometric"


def test_class_averages_default_centre(tmp_path, capsys, particles):
    # an MRC stack is turned about pixel (W // 2, H // 2), as the field's software does: the
    # same as the estimator fitted on the stack with one zero row and column appended
    _, noisy, path = particles
    out = tmp_path / "averages"
    proc = call(capsys, "class-averages", path, "--device", "cpu", "--out", out)
    assert proc.returncode == 0, proc.stderr
    info = json.loads((out / "class_averages.json").read_text())
    assert info["rotation_center"] == "fourier"
    with mrcfile.open(out / "class_averages.mrcs") as mrc:
        averages = np.array(mrc.data)
    padded = np.pad(noisy, ((0, 0), (0, 1), (0, 1)))
    est = InvariantAttentionClusterer(random_state=0, device="cpu").fit(padded)
    np.testing.assert_allclose(averages, est.invariant_means_.reshape(12, 17, 17)[:, :16, :16],
                               rtol=1e-5, atol=1e-5)


def test_class_averages_of_other_inputs(tmp_path, capsys, particles):
    _, noisy, _ = particles
    np.save(tmp_path / "x.npy", noisy)
    out = tmp_path / "o"
    proc = call(capsys, "class-averages", tmp_path / "x.npy", "--device", "cpu", "--out", out)
    assert proc.returncode == 0, proc.stderr
    with mrcfile.open(out / "class_averages.mrcs") as mrc:
        assert mrc.data.shape == (12, 16, 16)
        assert mrc.voxel_size.item() == (0.0, 0.0, 0.0)
    volume = write(tmp_path / "map.mrc", noisy, kind="volume")
    assert_usage_error(call(capsys, "class-averages", volume, "--out", out), "map.mrc", "volume")
    np.save(tmp_path / "rgb.npy", np.repeat(noisy[:, None], 3, axis=1))
    assert_usage_error(call(capsys, "class-averages", tmp_path / "rgb.npy", "--out", out),
                       "rgb.npy", "single-channel", "3 channels")


class TestOneStepClassAverages:
    def _averages(self, out):
        with mrcfile.open(out / "class_averages.mrcs") as mrc:
            return np.array(mrc.data)

    def test_one_step_is_class_averages(self, tmp_path, capsys, particles):
        # --one-step writes class_averages(X, n_neighbors=K, ...) of the stack, no labels
        from invariant_cluster import class_averages

        clean, noisy, path = particles
        out = tmp_path / "o"
        proc = call(capsys, "class-averages", path, "--rotation-center", "geometric",
                    "--one-step", "--n-neighbors", 5,
                    "--n-rotations", 4, "--no-refine", "--device", "cpu", "--out", out)
        assert proc.returncode == 0, proc.stderr
        assert sorted(p.name for p in out.iterdir()) == ["class_averages.json",
                                                         "class_averages.mrcs"]
        ref = class_averages(noisy, n_neighbors=5, n_rotations=4, refine=False, device="cpu")
        np.testing.assert_allclose(self._averages(out), ref, atol=1e-5)
        info = json.loads((out / "class_averages.json").read_text())
        assert info["method"] == "one-step" and info["n_neighbors"] == 5
        assert info["denoise"] is None and info["center"] is False
        # the 5 nearest of each image are its 5 quarter-turned copies: near the clean image
        err_avg = np.linalg.norm((self._averages(out) - clean).reshape(12, -1), axis=1)
        err_noisy = np.linalg.norm((noisy - clean).reshape(12, -1), axis=1)
        assert np.all(err_avg < 0.8 * err_noisy)

    def test_denoise_and_center(self, tmp_path, capsys, particles):
        from invariant_cluster import DihedralPCA, class_averages

        _, noisy, path = particles
        out = tmp_path / "d"
        proc = call(capsys, "class-averages", path, "--rotation-center", "geometric",
                    "--denoise", 8, "--denoise-size", 8,
                    "--center", "--reflection", "--n-neighbors", 5, "--n-rotations", 8,
                    "--device", "cpu", "--out", out)
        assert proc.returncode == 0, proc.stderr
        ref = class_averages(noisy, n_neighbors=5, n_rotations=8, reflection=True,
                             denoise=DihedralPCA(8, output_size=8), center=True, device="cpu")
        np.testing.assert_allclose(self._averages(out), ref, atol=1e-5)
        info = json.loads((out / "class_averages.json").read_text())
        assert info["denoise"]["n_components"] == 8 and info["denoise"]["output_size"] == 8
        assert info["center"] is True

    def test_denoise_auto(self, tmp_path, capsys, particles):
        from invariant_cluster import DihedralPCA, class_averages

        _, noisy, path = particles
        out = tmp_path / "a"
        proc = call(capsys, "class-averages", path, "--rotation-center", "geometric",
                    "--denoise", "auto", "--n-neighbors", 5, "--n-rotations", 8,
                    "--device", "cpu", "--out", out)
        assert proc.returncode == 0, proc.stderr
        ref = class_averages(noisy, n_neighbors=5, n_rotations=8,
                             denoise=DihedralPCA("auto"), device="cpu")
        np.testing.assert_allclose(self._averages(out), ref, atol=1e-5)
        info = json.loads((out / "class_averages.json").read_text())
        assert info["denoise"]["n_components"] == "auto"

    def test_steerable_filter(self, tmp_path, capsys, particles):
        # steerable_class_averages: the filtered plain means, or each image filtered alone
        from invariant_cluster.steerable import steerable_class_averages

        _, noisy, path = particles
        out = tmp_path / "s"
        proc = call(capsys, "class-averages", path, "--one-step", "--steerable-filter",
                    "--n-neighbors", 5, "--n-rotations", 4, "--no-refine", "--device", "cpu",
                    "--out", out)
        assert proc.returncode == 0, proc.stderr
        ref, choice = steerable_class_averages(noisy, n_neighbors=5, n_rotations=4,
                                               refine=False, device="cpu", return_choice=True)
        np.testing.assert_allclose(self._averages(out), ref, atol=1e-4)
        info = json.loads((out / "class_averages.json").read_text())
        assert info["steerable_filter"]["choice"] == choice["choice"]
        assert info["rotation_center"] == "fourier"

    @pytest.mark.parametrize("args, fragment", [
        (["--steerable-filter"], "--steerable-filter"),
        (["--one-step", "--steerable-filter", "--snr", "2"], "--steerable-filter"),
        (["--denoise-size", "8"], "--denoise-size"),
        (["--one-step", "--n-clusters", "2"], "--n-clusters"),
        (["--center", "--max-iter", "3"], "--max-iter"),
        (["--one-step", "--n-neighbors", "12"], "--n-neighbors"),
        (["--denoise", "4", "--denoise-size", "40"], "--denoise-size"),
        # the user's box (16), not the frame the Fourier centre pads it to (17)
        (["--denoise", "4", "--denoise-size", "17"], "the image size 16, got 17"),
        (["--pixel-size", "1.5"], "--pixel-size: only with --star"),
        (["--stack", "--one-step", "--n-neighbors", "3"], None),
        (["--denoise", "most"], "--denoise"),
    ])
    def test_errors(self, tmp_path, capsys, particles, args, fragment):
        _, _, path = particles
        proc = call(capsys, "class-averages", path, *args, "--device", "cpu",
                    "--out", tmp_path / "e")
        if fragment is None:  # accepted
            assert proc.returncode == 0, proc.stderr
        else:
            assert_usage_error(proc, fragment)


@pytest.mark.parametrize("suffix", [".bin", ".dat", ""])
def test_mrc_under_another_suffix_is_read_as_mrc(tmp_path, capsys, suffix):
    """An MRC file's first bytes name it ("MAP " at byte 208), whatever its suffix."""
    from invariant_cluster.datasets._files import load_input

    data = random_images((6, 10, 10), seed=3).astype(np.float32)
    path = write(tmp_path / "stack.mrcs", data)
    other = path.rename(tmp_path / f"stack{suffix}")
    X = load_input(other)[0]
    np.testing.assert_array_equal(np.asarray(X).reshape(data.shape), data)
    proc = call(capsys, "fit", other, "--out", tmp_path / "out", "--n-rotations", 4)
    assert proc.returncode == 0, proc.stderr


def test_stack_option(tmp_path, capsys):
    """--stack reads a .mrc whose header says volume as a stack of images."""
    data = random_images((6, 10, 10), seed=5).astype(np.float32)
    path = write(tmp_path / "stack.mrc", data, kind="volume")
    labels = tmp_path / "y.txt"
    labels.write_text("\n".join("0" * 6))
    assert_usage_error(call(capsys, "fit", path, "--out", tmp_path / "o"), "volume of 6",
                       "--stack")
    for command, extra in (("fit", ["--labels", labels]), ("neighbors", []),
                           ("class-averages", ["--one-step", "--n-neighbors", 2])):
        proc = call(capsys, command, path, "--stack", "--n-rotations", 4, *extra,
                    "--device", "cpu", "--out", tmp_path / command)
        assert proc.returncode == 0, proc.stderr
    assert_usage_error(call(capsys, "fit", tmp_path / "y.txt", "--stack", "--out",
                            tmp_path / "o"), "--stack: reads an MRC file")
    labels.write_text("0\n1\n")
    assert_usage_error(call(capsys, "fit", path, "--stack", "--labels", labels, "--out",
                            tmp_path / "o"), "expected one label per image (6), got 2")
