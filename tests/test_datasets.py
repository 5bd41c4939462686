"""Tests of invariant_cluster.datasets: IDX reader, loaders, fetchers and SE(2) data makers."""

from __future__ import annotations

import functools
import gzip
import hashlib
import http.server
import struct
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from invariant_cluster import datasets
from invariant_cluster.datasets import (
    fetch_fashion_mnist,
    fetch_mnist,
    load_digits_images,
    load_fashion_mnist,
    load_idx,
    load_mnist,
    make_transformed,
    make_transformed_copies,
)
from invariant_cluster.transforms import warp_se2

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}


# ----------------------------------------------------------------------------------------------
# helpers and fixtures
# ----------------------------------------------------------------------------------------------


def idx_bytes(array: np.ndarray, code: int | None = None) -> bytes:
    codes = {"uint8": 0x08, "int8": 0x09, "int16": 0x0B, "int32": 0x0C, "float32": 0x0D,
             "float64": 0x0E}
    code = codes[array.dtype.name] if code is None else code
    header = bytes([0, 0, code, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.astype(array.dtype.newbyteorder(">")).tobytes()


def write(path: Path, payload: bytes, compress: bool = False) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(payload, mtime=0) if compress else payload)
    return path


def fake_split(n: int, seed: int):
    rng = np.random.default_rng(seed)
    return (rng.integers(0, 256, (n, 28, 28), dtype=np.uint8),
            rng.integers(0, 10, n, dtype=np.uint8))


def write_split(directory: Path, split: str, n: int, seed: int, compress: bool = True):
    images, labels = fake_split(n, seed)
    suffix = ".gz" if compress else ""
    write(directory / (FILES[split][0] + suffix), idx_bytes(images), compress)
    write(directory / (FILES[split][1] + suffix), idx_bytes(labels), compress)
    return images, labels


def md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """No real data location, environment variable or proxy leaks into a test."""
    for var in ("INVARIANT_CLUSTER_DATA", "INVARIANT_CLUSTER_MIRROR", "http_proxy", "HTTP_PROXY",
                "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setattr(datasets._mnist, "_SYSTEM_DATA_DIR", tmp_path / "usr-share-datasets")


@pytest.fixture
def server(tmp_path):
    """An HTTP server on localhost serving ``tmp_path / "www"``; yields (root, base URL)."""
    root = tmp_path / "www"
    root.mkdir()

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Quiet, directory=str(root))
    )
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield root, f"http://127.0.0.1:{httpd.server_address[1]}/"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


def serve_split(root: Path, monkeypatch, dataset="mnist", split="test", n=7, seed=0):
    """Fake gz files on the server, their MD5s patched into CHECKSUMS."""
    images, labels = write_split(root, split, n, seed)
    for stem in FILES[split]:
        name = stem + ".gz"
        monkeypatch.setitem(datasets.CHECKSUMS[dataset], name, (md5(root / name),))
    return images, labels


# ----------------------------------------------------------------------------------------------
# load_idx
# ----------------------------------------------------------------------------------------------


class TestLoadIdx:
    @pytest.mark.parametrize("dtype", ["uint8", "int8", "int16", "int32", "float32", "float64"])
    @pytest.mark.parametrize("compress", [False, True])
    def test_round_trip(self, tmp_path, dtype, compress):
        rng = np.random.default_rng(0)
        array = (rng.normal(size=(3, 4, 5)) * 100).astype(dtype)
        path = write(tmp_path / "a-idx3", idx_bytes(array), compress)
        out = load_idx(path)
        assert out.dtype == np.dtype(dtype)
        assert out.dtype.isnative
        assert out.shape == (3, 4, 5)
        np.testing.assert_array_equal(out, array)
        out[0, 0, 0] = 1  # writable

    def test_one_dimension_and_str_path(self, tmp_path):
        array = np.arange(10, dtype=np.uint8)
        path = write(tmp_path / "labels-idx1-ubyte", idx_bytes(array))
        np.testing.assert_array_equal(load_idx(str(path)), array)

    def test_compression_is_detected_from_content_not_name(self, tmp_path):
        array = np.arange(12, dtype=np.int16).reshape(3, 4)
        gz_without_ext = write(tmp_path / "x-idx2", idx_bytes(array), compress=True)
        raw_with_ext = write(tmp_path / "y-idx2.gz", idx_bytes(array), compress=False)
        np.testing.assert_array_equal(load_idx(gz_without_ext), array)
        np.testing.assert_array_equal(load_idx(raw_with_ext), array)

    @pytest.mark.parametrize("compress", [False, True])
    @pytest.mark.parametrize(
        "mutate, match",
        [
            (lambda b: b[:-5], "truncated IDX data"),
            (lambda b: b[:9], "truncated IDX header"),
            (lambda b: b[:3], "truncated IDX file"),
            (lambda b: b"\x12\x34" + b[2:], "wrong magic number"),
            (lambda b: b[:2] + b"\x0a" + b[3:], "unsupported IDX type code 0x0a"),
            (lambda b: b + b"\x00\x00", "size does not match the header"),
        ],
        ids=["truncated-data", "truncated-header", "too-short", "bad-magic", "bad-type-code",
             "trailing-bytes"],
    )
    def test_malformed(self, tmp_path, compress, mutate, match):
        good = idx_bytes(np.zeros((2, 3, 3), dtype=np.uint8))
        path = write(tmp_path / "bad-idx3-ubyte", mutate(good), compress)
        with pytest.raises(ValueError, match=match) as info:
            load_idx(path)
        assert str(path) in str(info.value)

    def test_size_mismatch_with_header(self, tmp_path):
        header = bytes([0, 0, 0x08, 2]) + struct.pack(">II", 4, 4)
        path = write(tmp_path / "short", header + bytes(10))
        with pytest.raises(ValueError, match=r"shape \(4, 4\).*16 bytes.*10 bytes"):
            load_idx(path)

    def test_truncated_gzip_stream(self, tmp_path):
        payload = gzip.compress(idx_bytes(np.arange(1000, dtype=np.int32)))
        path = write(tmp_path / "cut.gz", payload[: len(payload) // 2])
        with pytest.raises(ValueError, match="broken gzip stream") as info:
            load_idx(path)
        assert str(path) in str(info.value)

    def test_missing_file_and_bad_type(self, tmp_path):
        with pytest.raises(FileNotFoundError):
            load_idx(tmp_path / "nope")
        with pytest.raises(TypeError, match="path"):
            load_idx(123)


# ----------------------------------------------------------------------------------------------
# load_mnist / load_fashion_mnist
# ----------------------------------------------------------------------------------------------


class TestLoadMnist:
    @pytest.mark.parametrize("layout", ["direct", "subfolder"])
    @pytest.mark.parametrize("compress", [False, True])
    def test_layouts_and_bunch(self, tmp_path, layout, compress):
        base = tmp_path / "data"
        directory = base if layout == "direct" else base / "mnist"
        images, labels = write_split(directory, "test", 5, 0, compress)
        bunch = load_mnist(data_home=base)
        assert bunch.data.shape == (5, 784) and bunch.data.dtype == np.float32
        assert bunch.images.shape == (5, 28, 28) and bunch.images.dtype == np.float32
        assert bunch.target.dtype == np.int64
        np.testing.assert_array_equal(bunch.target, labels)
        np.testing.assert_allclose(bunch.images, images / 255.0, rtol=1e-6)
        assert 0.0 <= bunch.data.min() and bunch.data.max() <= 1.0
        assert np.shares_memory(bunch.data, bunch.images)
        assert list(bunch.target_names) == list(range(10))
        assert len(bunch.feature_names) == 784 and "MNIST" in bunch.DESCR
        assert bunch.filenames == [str(directory / (s + (".gz" if compress else "")))
                                   for s in FILES["test"]]
        assert bunch.split == "test"
        # the subfolder itself works as data_home too
        np.testing.assert_array_equal(load_mnist(data_home=directory).target, labels)

    def test_splits_and_return_X_y(self, tmp_path):
        train_images, train_labels = write_split(tmp_path / "mnist", "train", 6, 1)
        test_images, test_labels = write_split(tmp_path / "mnist", "test", 4, 2)
        X, y = load_mnist("train", data_home=tmp_path, return_X_y=True)
        assert X.shape == (6, 784)
        np.testing.assert_array_equal(y, train_labels)
        bunch = load_mnist("all", data_home=tmp_path)
        assert bunch.data.shape == (10, 784)
        np.testing.assert_array_equal(bunch.target, np.concatenate([train_labels, test_labels]))
        np.testing.assert_allclose(bunch.images[6:] * 255, test_images, atol=1e-4)
        assert len(bunch.filenames) == 4

    def test_test_split_needs_only_test_files(self, tmp_path):
        write_split(tmp_path, "test", 3, 0)
        assert load_mnist("test", data_home=tmp_path).data.shape == (3, 784)
        with pytest.raises(FileNotFoundError, match="train-images-idx3-ubyte"):
            load_mnist("all", data_home=tmp_path)

    @pytest.mark.parametrize("split", ["valid", "TEST", None])
    def test_bad_split(self, tmp_path, split):
        with pytest.raises(ValueError, match="split"):
            load_mnist(split, data_home=tmp_path)

    def test_bad_data_home_type(self):
        with pytest.raises(TypeError, match="data_home"):
            load_mnist(data_home=3)

    def test_missing_lists_every_place(self, tmp_path, monkeypatch):
        env_dir = tmp_path / "env"
        monkeypatch.setenv("INVARIANT_CLUSTER_DATA", str(env_dir))
        with pytest.raises(FileNotFoundError) as info:
            load_mnist(data_home=tmp_path / "dh")
        message = str(info.value)
        for place in [tmp_path / "dh" / "mnist", tmp_path / "dh", env_dir / "mnist", env_dir,
                      tmp_path / "home" / "invariant_cluster_data" / "mnist",
                      tmp_path / "home" / "invariant_cluster_data",
                      tmp_path / "usr-share-datasets" / "mnist"]:
            assert f"- {place}\n" in message
        assert "t10k-images-idx3-ubyte" in message and "t10k-labels-idx1-ubyte" in message
        assert "fetch_mnist(download=True)" in message

    def test_missing_fashion_mentions_apt(self):
        with pytest.raises(FileNotFoundError) as info:
            load_fashion_mnist()
        message = str(info.value)
        assert "apt-get install dataset-fashion-mnist" in message
        assert "fetch_fashion_mnist(download=True)" in message
        assert "INVARIANT_CLUSTER_DATA: not set" in message

    def test_env_var_lookup(self, tmp_path, monkeypatch):
        _, labels = write_split(tmp_path / "b" / "mnist", "test", 3, 0)
        monkeypatch.setenv("INVARIANT_CLUSTER_DATA", f"{tmp_path / 'a'}:{tmp_path / 'b'}")
        np.testing.assert_array_equal(load_mnist().target, labels)

    def test_home_lookup(self, tmp_path):
        _, labels = write_split(tmp_path / "home" / "invariant_cluster_data" / "mnist",
                                "test", 3, 0)
        np.testing.assert_array_equal(load_mnist().target, labels)

    def test_system_lookup(self, tmp_path):
        _, labels = write_split(tmp_path / "usr-share-datasets" / "fashion-mnist", "test", 3, 0)
        bunch = load_fashion_mnist()
        np.testing.assert_array_equal(bunch.target, labels)
        assert bunch.target_names[0] == "T-shirt/top" and len(bunch.target_names) == 10

    def test_search_order(self, tmp_path, monkeypatch):
        _, from_home = write_split(tmp_path / "home" / "invariant_cluster_data", "test", 2, 1)
        _, from_env = write_split(tmp_path / "env", "test", 3, 2)
        _, from_arg = write_split(tmp_path / "arg", "test", 4, 3)
        monkeypatch.setenv("INVARIANT_CLUSTER_DATA", str(tmp_path / "env"))
        np.testing.assert_array_equal(load_mnist(data_home=tmp_path / "arg").target, from_arg)
        np.testing.assert_array_equal(load_mnist().target, from_env)
        monkeypatch.delenv("INVARIANT_CLUSTER_DATA")
        np.testing.assert_array_equal(load_mnist().target, from_home)

    def test_fashion_never_read_from_an_mnist_folder(self, tmp_path):
        write_split(tmp_path / "mnist", "test", 3, 0)
        with pytest.raises(FileNotFoundError):
            load_fashion_mnist(data_home=tmp_path / "mnist")

    def test_wrong_image_shape(self, tmp_path):
        write(tmp_path / "t10k-images-idx3-ubyte", idx_bytes(np.zeros((2, 8, 8), np.uint8)))
        write(tmp_path / "t10k-labels-idx1-ubyte", idx_bytes(np.zeros(2, np.uint8)))
        with pytest.raises(ValueError, match=r"t10k-images-idx3-ubyte.*\(n, 28, 28\)"):
            load_mnist(data_home=tmp_path)

    def test_label_count_mismatch(self, tmp_path):
        write(tmp_path / "t10k-images-idx3-ubyte", idx_bytes(np.zeros((2, 28, 28), np.uint8)))
        write(tmp_path / "t10k-labels-idx1-ubyte", idx_bytes(np.zeros(3, np.uint8)))
        with pytest.raises(ValueError, match="3 labels .* 2 images"):
            load_mnist(data_home=tmp_path)

    def test_malformed_file_is_named(self, tmp_path):
        write_split(tmp_path, "test", 2, 0, compress=False)
        bad = tmp_path / "t10k-labels-idx1-ubyte"
        bad.write_bytes(bad.read_bytes()[:-1])
        with pytest.raises(ValueError, match="t10k-labels-idx1-ubyte.*truncated"):
            load_mnist(data_home=tmp_path)


def read_md5sums():
    sums = {}
    for line in (SHARED_DATA / "MD5SUMS").read_text().splitlines():
        if line.strip():
            value, name = line.split()
            sums[name.lstrip("*")] = value
    return sums


@pytest.mark.skipif(not (SHARED_DATA / "MD5SUMS").is_file(), reason="shared data not present")
class TestRealData:
    def test_mnist_test_split(self):
        bunch = load_mnist("test", data_home=SHARED_DATA)
        assert bunch.data.shape == (10000, 784) and bunch.images.shape == (10000, 28, 28)
        assert bunch.data.min() == 0.0 and bunch.data.max() == 1.0
        np.testing.assert_array_equal(np.unique(bunch.target), np.arange(10))
        sums = read_md5sums()
        for filename in bunch.filenames:
            path = Path(filename)
            assert md5(path) == sums[f"mnist/{path.name}"]
        # the dataset's own folder works as data_home as well
        assert load_mnist(data_home=SHARED_DATA / "mnist").filenames == bunch.filenames

    def test_fashion_test_split(self):
        X, y = load_fashion_mnist("test", data_home=SHARED_DATA, return_X_y=True)
        assert X.shape == (10000, 784)
        np.testing.assert_array_equal(np.bincount(y), np.full(10, 1000))

    def test_checksum_table_accepts_shared_files(self):
        for name, value in read_md5sums().items():
            dataset, filename = name.split("/")
            assert value in datasets.CHECKSUMS[dataset][filename]


def test_checksum_table_shape():
    for dataset in ("mnist", "fashion-mnist"):
        names = {s + ".gz" for pair in FILES.values() for s in pair}
        assert set(datasets.CHECKSUMS[dataset]) == names
        for values in datasets.CHECKSUMS[dataset].values():
            assert all(len(v) == 32 and int(v, 16) >= 0 for v in values)


# ----------------------------------------------------------------------------------------------
# fetch_mnist / fetch_fashion_mnist against a local HTTP server
# ----------------------------------------------------------------------------------------------


class TestFetch:
    def test_good_download(self, tmp_path, server, monkeypatch):
        root, url = server
        images, labels = serve_split(root, monkeypatch)
        bunch = fetch_mnist(tmp_path / "dh", mirror=url, timeout=5)
        target = tmp_path / "dh" / "mnist"
        assert sorted(p.name for p in target.iterdir()) == sorted(s + ".gz" for s in FILES["test"])
        np.testing.assert_array_equal(bunch.target, labels)
        np.testing.assert_allclose(bunch.images * 255, images, atol=1e-4)
        for stem in FILES["test"]:
            assert md5(target / (stem + ".gz")) == md5(root / (stem + ".gz"))
        # present files are not downloaded again: the server may now be empty
        for p in root.iterdir():
            p.unlink()
        np.testing.assert_array_equal(fetch_mnist(tmp_path / "dh", mirror=url).target, labels)

    def test_checksum_mismatch(self, tmp_path, server, monkeypatch):
        root, url = server
        serve_split(root, monkeypatch)
        name = "t10k-images-idx3-ubyte.gz"
        monkeypatch.setitem(datasets.CHECKSUMS["mnist"], name, ("0" * 32,))
        with pytest.raises(ValueError) as info:
            fetch_mnist(tmp_path / "dh", mirror=url)
        message = str(info.value)
        assert name in message and "0" * 32 in message and md5(root / name) in message
        assert not (tmp_path / "dh" / "mnist" / name).exists()
        assert not list((tmp_path / "dh" / "mnist").glob(".*part"))

    def test_404(self, tmp_path, server, monkeypatch):
        root, url = server
        serve_split(root, monkeypatch)
        (root / "t10k-labels-idx1-ubyte.gz").unlink()
        with pytest.raises(OSError, match="404") as info:
            fetch_mnist(tmp_path / "dh", mirror=url)
        assert f"{url}t10k-labels-idx1-ubyte.gz" in str(info.value)
        assert not isinstance(info.value, FileNotFoundError)
        leftovers = [p.name for p in (tmp_path / "dh" / "mnist").iterdir()]
        assert leftovers == ["t10k-images-idx3-ubyte.gz"]  # the good file is kept

    def test_env_mirror_placeholder_and_fallback(self, tmp_path, server, monkeypatch):
        root, url = server
        _, labels = serve_split(root / "fashion-mnist", monkeypatch, dataset="fashion-mnist")
        monkeypatch.setenv("INVARIANT_CLUSTER_MIRROR", f"{url}missing/ {url}{{dataset}}")
        monkeypatch.setenv("INVARIANT_CLUSTER_DATA", str(tmp_path / "env"))
        bunch = fetch_fashion_mnist()
        np.testing.assert_array_equal(bunch.target, labels)
        assert bunch.filenames[0].startswith(str(tmp_path / "env" / "fashion-mnist"))

    def test_download_false(self, tmp_path):
        with pytest.raises(FileNotFoundError, match="fetch_mnist"):
            fetch_mnist(tmp_path, download=False, mirror="http://127.0.0.1:9/")

    @pytest.mark.parametrize(
        "kwargs, error, match",
        [
            ({"dataset": "cifar"}, ValueError, "dataset"),
            ({"split": "val"}, ValueError, "split"),
            ({"timeout": 0}, ValueError, "timeout"),
            ({"download": "yes"}, TypeError, "download"),
            ({"mirror": 5}, TypeError, "mirror"),
            ({"mirror": []}, ValueError, "mirror"),
            ({"mirror": "example.org/mnist"}, ValueError, "mirror"),
        ],
    )
    def test_bad_arguments(self, tmp_path, kwargs, error, match):
        with pytest.raises(error, match=match):
            fetch_mnist(tmp_path, **kwargs)


# ----------------------------------------------------------------------------------------------
# load_digits_images
# ----------------------------------------------------------------------------------------------


def test_load_digits_images():
    bunch = load_digits_images()
    assert bunch.images.shape == (1797, 8, 8) and bunch.images.dtype == np.float32
    assert bunch.data.shape == (1797, 64) and bunch.data.dtype == np.float32
    assert bunch.data.min() == 0.0 and bunch.data.max() == 1.0
    np.testing.assert_array_equal(bunch.images.reshape(1797, 64), bunch.data)
    assert bunch.target.dtype == np.int64 and set(bunch.target) == set(range(10))
    X, y = load_digits_images(return_X_y=True)
    np.testing.assert_array_equal(X, bunch.data)
    np.testing.assert_array_equal(y, bunch.target)


# ----------------------------------------------------------------------------------------------
# make_transformed / make_transformed_copies
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def digits():
    return load_digits_images().images[:12]


class TestMakeTransformed:
    def test_reproducible(self, digits):
        a, pa = make_transformed(digits, 90, 2, random_state=3)
        b, pb = make_transformed(digits, 90, 2, random_state=3)
        c, pc = make_transformed(digits, 90, 2, random_state=4)
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(pa, pb)
        assert not np.allclose(pa, pc)

    def test_angles_do_not_depend_on_translation_range(self, digits):
        _, p0 = make_transformed(digits, 30, 0, random_state=1)
        _, p1 = make_transformed(digits, 30, 3, random_state=1)
        np.testing.assert_array_equal(p0[:, 0], p1[:, 0])
        np.testing.assert_array_equal(p0[:, 1:], 0.0)
        assert not np.signbit(p0[:, 1:]).any()

    @pytest.mark.parametrize("dtype", [np.float32, np.float64])
    def test_identity_is_exact(self, digits, dtype):
        X = digits.astype(dtype)
        out, params = make_transformed(X, 0, 0, random_state=0)
        assert out.dtype == dtype
        np.testing.assert_array_equal(out, X)
        assert not np.shares_memory(out, X)
        np.testing.assert_array_equal(params, np.zeros((len(X), 3)))

    def test_params_in_range(self):
        X = np.zeros((500, 4, 4), dtype=np.float32)
        _, params = make_transformed(X, 20.0, 1.5, random_state=0)
        assert params.shape == (500, 3) and params.dtype == np.float64
        assert np.abs(params[:, 0]).max() <= 20.0 and np.abs(params[:, 1:]).max() <= 1.5
        # uniform over the whole range, not a fraction of it
        assert np.abs(params[:, 0]).max() > 19.0 and np.abs(params[:, 1:]).max() > 1.4
        assert params[:, 0].min() < -19.0

    def test_warp_reproduces_3d(self, digits):
        out, params = make_transformed(digits, 180, 1.5, random_state=0)
        assert out.shape == digits.shape and out.dtype == digits.dtype
        np.testing.assert_allclose(warp_se2(digits, params), out, rtol=0, atol=1e-6)
        assert not np.allclose(out, digits)

    def test_warp_reproduces_4d(self):
        X = np.random.default_rng(0).random((4, 3, 9, 9))
        out, params = make_transformed(X, 45, 1, random_state=0)
        assert out.shape == X.shape and out.dtype == np.float64
        np.testing.assert_allclose(warp_se2(X, params), out, rtol=0, atol=1e-12)

    def test_flat_with_image_shape(self):
        X = np.random.default_rng(0).random((5, 2 * 6 * 4)).astype(np.float32)
        out, params = make_transformed(X, 60, 1, image_shape=(2, 6, 4), random_state=0)
        assert out.shape == X.shape and out.dtype == np.float32
        expected = warp_se2(X.reshape(5, 2, 6, 4), params).reshape(5, -1)
        np.testing.assert_allclose(expected, out, rtol=0, atol=1e-6)

    def test_flat_square_default(self, digits):
        flat = digits.reshape(len(digits), -1)
        out, params = make_transformed(flat, 90, 0, random_state=0)
        out3, params3 = make_transformed(digits, 90, 0, random_state=0)
        np.testing.assert_array_equal(params, params3)
        np.testing.assert_allclose(out.reshape(digits.shape), out3, rtol=0, atol=1e-6)

    def test_integer_input_gives_float32(self):
        X = np.arange(2 * 5 * 5, dtype=np.uint8).reshape(2, 5, 5)
        out, params = make_transformed(X, 10, random_state=0)
        assert out.dtype == np.float32 and out.shape == X.shape
        np.testing.assert_allclose(warp_se2(X.astype(np.float32), params), out, atol=1e-5)

    def test_torch_in_torch_out(self, digits):
        X = torch.from_numpy(digits).double()
        out, params = make_transformed(X, 45, 1, random_state=0)
        assert isinstance(out, torch.Tensor) and out.dtype == torch.float64
        expected, _ = make_transformed(digits.astype(np.float64), 45, 1, random_state=0)
        np.testing.assert_allclose(out.numpy(), expected, atol=1e-12)

    @pytest.mark.parametrize(
        "kwargs, error, match",
        [
            ({"max_rotation": -1}, ValueError, "max_rotation"),
            ({"max_rotation": float("inf")}, ValueError, "max_rotation"),
            ({"max_rotation": "45"}, TypeError, "max_rotation"),
            ({"max_translation": -0.5}, ValueError, "max_translation"),
            ({"max_translation": True}, TypeError, "max_translation"),
            ({"image_shape": (3, 3)}, ValueError, "image_shape"),
        ],
    )
    def test_bad_arguments(self, digits, kwargs, error, match):
        with pytest.raises(error, match=match):
            make_transformed(digits, **kwargs)

    def test_bad_X(self):
        with pytest.raises(ValueError, match="X"):
            make_transformed(np.zeros(5))
        with pytest.raises(ValueError, match="X"):
            make_transformed(np.full((2, 3, 3), np.nan))


class TestMakeTransformedCopies:
    @pytest.mark.parametrize("shape", [(8, 8), (3, 8, 8)])
    def test_shapes_and_reproduction(self, shape):
        image = np.random.default_rng(0).random(shape).astype(np.float32)
        copies, params = make_transformed_copies(image, 5, max_translation=1, random_state=0)
        assert copies.shape == (5, *shape) and copies.dtype == np.float32
        assert params.shape == (5, 3) and np.abs(params[:, 0]).max() <= 180
        expected = warp_se2(np.repeat(image[None], 5, axis=0), params)
        np.testing.assert_allclose(expected, copies, rtol=0, atol=1e-6)
        again, _ = make_transformed_copies(image, 5, max_translation=1, random_state=0)
        np.testing.assert_array_equal(again, copies)

    def test_torch_image(self):
        image = torch.rand(6, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
        copies, params = make_transformed_copies(image, 3, random_state=1)
        assert isinstance(copies, torch.Tensor) and copies.shape == (3, 6, 6)
        expected = warp_se2(image.expand(3, 6, 6).numpy(), params)
        np.testing.assert_allclose(copies.numpy(), expected, atol=1e-12)

    @pytest.mark.parametrize(
        "image, n_copies, error, match",
        [
            (np.zeros((4, 4)), 0, ValueError, "n_copies"),
            (np.zeros((4, 4)), 2.0, TypeError, "n_copies"),
            (np.zeros((4, 4)), True, TypeError, "n_copies"),
            (np.zeros(16), 2, ValueError, "image"),
            (np.zeros((1, 1, 4, 4)), 2, ValueError, "image"),
        ],
    )
    def test_bad_arguments(self, image, n_copies, error, match):
        with pytest.raises(error, match=match):
            make_transformed_copies(image, n_copies)


# ----------------------------------------------------------------------------------------------
# load_images: a folder of images of different sizes
# ----------------------------------------------------------------------------------------------

# (height, width) of the images written: tall, wide and large, as real image sets come
SIZES = [(31, 60), (100, 40), (341, 200)]


def _write_objects(folder, sizes=SIZES, fmt="png"):
    """Dark discs (grey 40) on white, one image per size, the disc centred and spanning half the
    shorter side; returns the files' names in name order."""
    from PIL import Image

    folder.mkdir(exist_ok=True)
    names = []
    for i, (h, w) in enumerate(sizes):
        yy, xx = np.mgrid[:h, :w]
        r = min(h, w) / 4
        disc = (yy - (h - 1) / 2) ** 2 + (xx - (w - 1) / 2) ** 2 <= r ** 2
        a = np.where(disc, 40, 255).astype(np.uint8)
        names.append(f"img{i}.{fmt}")
        Image.fromarray(a).save(folder / names[-1])
    return names


class TestLoadImages:
    def test_shapes_sizes_and_names(self, tmp_path):
        names = _write_objects(tmp_path / "f")
        (tmp_path / "f" / "notes.txt").write_text("not an image")  # left out
        b = datasets.load_images(tmp_path / "f", size=48)
        assert b.images.shape == (3, 48, 48) and b.images.dtype == np.float32
        assert b.data.shape == (3, 48 * 48) and np.shares_memory(b.data, b.images)
        assert b.filenames == names
        np.testing.assert_array_equal(b.original_shapes, SIZES)
        assert b.images.min() >= 0.0 and b.images.max() <= 1.0

    def test_longest_side_scaled_and_centred_on_the_background(self, tmp_path):
        _write_objects(tmp_path / "f")
        size = 48
        b = datasets.load_images(tmp_path / "f", size=size)
        np.testing.assert_array_equal(b.background, np.ones(3, np.float32))
        for img, (h, w) in zip(b.images, SIZES):
            # the canvas outside the scaled image and the scaled image's own border are white
            nh, nw = round(h * size / max(h, w)), round(w * size / max(h, w))
            assert max(nh, nw) == size
            top, left = (size - nh) // 2, (size - nw) // 2
            outside = np.ones((size, size), bool)
            outside[top:top + nh, left:left + nw] = False
            assert np.all(img[outside] == 1.0)
            # the dark disc keeps its share of the image (area ratio) and sits at the centre
            dark = 1.0 - img
            share = dark.sum() / (nh * nw * (255 - 40) / 255)
            assert share == pytest.approx(np.pi * (min(h, w) / 4) ** 2 / (h * w), rel=0.1)
            yy, xx = np.mgrid[:size, :size]
            centre = ((dark * yy).sum() / dark.sum(), (dark * xx).sum() / dark.sum())
            np.testing.assert_allclose(centre, ((size - 1) / 2, (size - 1) / 2), atol=0.6)

    def test_invert_makes_a_white_background_zero(self, tmp_path):
        _write_objects(tmp_path / "f")
        plain = datasets.load_images(tmp_path / "f", size=32)
        inv = datasets.load_images(tmp_path / "f", size=32, invert=True)
        np.testing.assert_allclose(inv.images, 1.0 - plain.images, atol=1e-6)
        np.testing.assert_array_equal(inv.background, np.zeros(3, np.float32))
        # bright objects on 0: the corners are 0 and the centre is the disc's 1 - 40 / 255
        assert np.all(inv.images[:, 0, 0] == 0.0)
        np.testing.assert_allclose(inv.images[:, 16, 16], 1 - 40 / 255, atol=0.03)

    def test_background_is_the_border_median(self, tmp_path):
        # a grey background (value 100) with a few bright border pixels: the median ignores
        # them and the canvas takes the background's value
        from PIL import Image

        (tmp_path / "f").mkdir()
        a = np.full((20, 50), 100, np.uint8)
        a[0, :5] = 255
        a[8:12, 20:30] = 0
        Image.fromarray(a).save(tmp_path / "f" / "a.png")
        Image.fromarray(a.T.copy()).save(tmp_path / "f" / "b.tif")
        b = datasets.load_images(tmp_path / "f", size=25)
        np.testing.assert_allclose(b.background, 100 / 255, atol=1e-6)
        assert np.all(b.images[:, 0, 12] == np.float32(100 / 255))  # canvas above/left of each
        np.testing.assert_array_equal(b.original_shapes, [(20, 50), (50, 20)])

    def test_same_size_images_keep_their_pixels(self, tmp_path):
        # an image already size x size is read as it is, in [0, 1]
        from PIL import Image

        (tmp_path / "f").mkdir()
        a = np.random.default_rng(0).integers(0, 256, (16, 16)).astype(np.uint8)
        Image.fromarray(a).save(tmp_path / "f" / "a.png")
        b = datasets.load_images(tmp_path / "f", size=16)
        np.testing.assert_array_equal(b.images[0], a.astype(np.float32) / np.float32(255))

    def test_bad_input(self, tmp_path):
        with pytest.raises(FileNotFoundError, match="no such folder"):
            datasets.load_images(tmp_path / "missing", size=8)
        (tmp_path / "empty").mkdir()
        with pytest.raises(ValueError, match=r"empty: no images \(\*\.png"):
            datasets.load_images(tmp_path / "empty", size=8)
        (tmp_path / "empty" / "a.csv").write_text("1,2")
        with pytest.raises(ValueError, match="no images"):
            datasets.load_images(tmp_path / "empty", size=8)
        with pytest.raises(ValueError, match="expected a folder"):
            datasets.load_images(tmp_path / "empty" / "a.csv", size=8)
        _write_objects(tmp_path / "f")
        for size, error in ((1, ValueError), (0, ValueError), (2.5, TypeError),
                            ("8", TypeError), (True, TypeError)):
            with pytest.raises(error, match="size: expected an int"):
                datasets.load_images(tmp_path / "f", size=size)
        with pytest.raises(TypeError, match="invert: expected a bool"):
            datasets.load_images(tmp_path / "f", size=8, invert="yes")
        (tmp_path / "f" / "broken.png").write_bytes(b"not a png")
        with pytest.raises(ValueError, match=r"broken\.png: cannot read this image"):
            datasets.load_images(tmp_path / "f", size=8)
