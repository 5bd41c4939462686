"""The output folder: each command writes files of its own names, replaces only those of an
earlier run of itself, and leaves nothing partial when it fails."""

import numpy as np
import pytest
from _cli import call
from _images import t_and_box

from invariant_cluster import warp_se2

SEARCH = ["--group", "rotation", "--n-rotations", "4", "--device", "cpu"]
FAST = [*SEARCH, "--n-neighbors", "4", "--max-iter", "10"]


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """Quarter turns of a T (6) and a box (4) as a .npy file, and their labels in another."""
    t, box = t_and_box()
    angles = np.array([0, 90, 180, 270, 90, 180, 0, 90, 180, 270], dtype=np.float32)
    X = warp_se2(np.stack([t] * 6 + [box] * 4), np.c_[angles, np.zeros((10, 2), np.float32)])
    d = tmp_path_factory.mktemp("data")
    np.save(d / "x.npy", X)
    np.save(d / "y.npy", np.array([0] * 6 + [1] * 4))
    return d / "x.npy", d / "y.npy"


def _files(out):
    """Every entry of ``out`` (hidden ones too), name -> bytes."""
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


def _run(capsys, *args):
    proc = call(capsys, *args)
    assert proc.returncode == 0, proc.stderr
    return proc


def test_each_command_has_files_of_its_own_names():
    from invariant_cluster import _cli_demo, cli

    sets = {"demo": _cli_demo.FILES, "fit": cli._FIT_FILES,
            "class-averages": cli._AVERAGES_FILES, "neighbors": cli._NEIGHBORS_FILES}
    names = [n for files in sets.values() for n in files]
    assert len(names) == len(set(names)), sets


def test_commands_share_a_folder(tmp_path, capsys, images):
    pytest.importorskip("mrcfile")  # class-averages needs it
    x, y = images
    out = tmp_path / "out"
    _run(capsys, "fit", x, "--labels", y, *FAST, "--out", out)
    fit = _files(out)
    assert sorted(fit) == ["alignments.csv", "centers.npy", "centers.png", "labels.csv",
                           "metrics.json", "shapes.png"]
    assert fit["labels.csv"].decode().splitlines()[0] == "index,label,shape,true_label"

    # class-averages beside it: fit's files stay as they were, byte for byte
    _run(capsys, "class-averages", x, *FAST, "--out", out)
    both = _files(out)
    assert {k: both[k] for k in fit} == fit
    averages = {k: v for k, v in both.items() if k not in fit}
    assert sorted(averages) == ["class_averages.json", "class_averages.mrcs",
                                "class_labels.csv"]
    # the labels of each command describe its own run: one per image, in each file
    assert len(both["class_labels.csv"].decode().splitlines()) == 1 + 10

    # fit again, without labels: its metrics.json goes (it would contradict the new
    # labels.csv), its other files are replaced, class-averages' stay
    _run(capsys, "fit", x, *FAST, "--out", out)
    again = _files(out)
    assert {k: again[k] for k in averages} == averages
    assert "metrics.json" not in again
    assert again["labels.csv"].decode().splitlines()[0] == "index,label,shape"
    assert sorted(again) == sorted({*averages, *fit} - {"metrics.json"})

    # class-averages again, one step (no clustering): its class_labels.csv goes, fit's stay
    _run(capsys, "class-averages", x, *SEARCH, "--one-step", "--n-neighbors", "3", "--out", out)
    last = _files(out)
    fit_now = {k: v for k, v in again.items() if k not in averages}
    assert {k: last[k] for k in fit_now} == fit_now
    assert "class_labels.csv" not in last
    assert sorted(last) == sorted({*fit_now, "class_averages.json", "class_averages.mrcs"})

    # neighbors: its own files beside both
    _run(capsys, "neighbors", x, *SEARCH, "--n-neighbors", "3", "--out", out)
    final = _files(out)
    assert {k: final[k] for k in last} == last
    assert sorted(set(final) - set(last)) == ["alignments.npy", "distances.npy", "graph.npz",
                                             "indices.npy", "neighbors.json"]


def test_failure_while_writing_leaves_the_earlier_run(tmp_path, capsys, monkeypatch, images):
    """A run that fails half-way through its files (here the figure, after the CSV files and
    centers.npy are written) leaves the earlier run whole and nothing of its own."""
    import invariant_cluster.cli as cli

    x, y = images
    out = tmp_path / "out"
    _run(capsys, "fit", x, *FAST, "--out", out)
    (out / "notes.txt").write_text("the user's own file")
    before = _files(out)

    def disk_full(ax, path):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(cli, "_save_figure", disk_full)
    proc = call(capsys, "fit", x, "--labels", y, *FAST, "--out", out)
    assert proc.returncode != 0 and "No space left" in proc.stderr
    assert _files(out) == before


def test_an_undeclared_file_is_refused(tmp_path):
    from invariant_cluster._cli_support import _replacing

    out = tmp_path / "out"
    out.mkdir()
    (out / "a.txt").write_text("earlier")
    with pytest.raises(RuntimeError, match=r"\['b.txt'\]"):
        with _replacing(out, ["a.txt"]) as stage:
            (stage / "a.txt").write_text("new")
            (stage / "b.txt").write_text("not the command's")
    assert _files(out) == {"a.txt": b"earlier"}
