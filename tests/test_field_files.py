"""Files written by the field's own software (RELION 3.0, 3.1 and 5, cryoSPARC, cryoDRGN, EMPIAR
depositions), read from ``../shared/data/field`` (see its README): the MRC stacks, the STAR and
``.cs`` files, and ``class-averages --star`` on them. Skipped where the folder is absent."""

import warnings

import numpy as np
import pytest
from _images import DATA

from invariant_cluster.ctf import read_cs, read_star
from invariant_cluster.datasets import load_mrc

starfile = pytest.importorskip("starfile")
mrcfile = pytest.importorskip("mrcfile")

FIELD = DATA / "field"

pytestmark = [pytest.mark.usefixtures("torch_single_thread")]

CTF_FIELDS = ("defocus_u", "defocus_v", "defocus_angle", "voltage", "spherical_aberration",
              "amplitude_contrast", "pixel_size", "phase_shift")


@pytest.fixture(scope="module")
def field():
    if not (FIELD / "README.md").is_file():
        pytest.skip(f"no folder of the field's files at {FIELD}")
    return FIELD


def _raw(path):
    """The file's data as mrcfile's permissive reader gives it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with mrcfile.open(path, permissive=True) as mrc:
            return np.array(mrc.data, dtype=np.float32)


def test_relion31_mrcs_without_id_and_stamp(field):
    with pytest.warns(RuntimeWarning, match="no 'MAP ' ID string and no machine stamp"):
        images = load_mrc(field / "relion31.mrcs")
    assert images.shape == (5, 256, 256)
    np.testing.assert_array_equal(images, _raw(field / "relion31.mrcs"))


def test_empiar_mrc_is_a_stack(field):
    path = field / "empiar_10076_7.mrc"
    with pytest.raises(ValueError, match="volume of 7 sections.*as_stack=True"):
        load_mrc(path)
    images = load_mrc(path, as_stack=True)
    assert images.shape == (7, 320, 320)
    np.testing.assert_array_equal(images, _raw(path))


def _expected(path, optics_columns=()):
    """The file's columns per particle, read with starfile alone (joined by hand)."""
    blocks = starfile.read(path, always_dict=True)
    table = blocks.get("particles", next(iter(blocks.values())))
    if "optics" in blocks:
        optics = blocks["optics"].set_index("rlnOpticsGroup")
        for c in optics_columns:
            table = table.assign(**{c: [optics.loc[g, c] for g in table["rlnOpticsGroup"]]})
    return table


@pytest.mark.parametrize("name, n", [("relion31.star", 5), ("relion31.6opticsgroups.star", 139),
                                     ("relion5.star", 17)])
def test_relion31_optics_groups(field, name, n):
    ctf, table = read_star(field / name, n_images=n)
    ref = _expected(field / name, ("rlnVoltage", "rlnSphericalAberration",
                                   "rlnAmplitudeContrast", "rlnImagePixelSize"))
    assert len(ctf) == len(table) == n
    for f, c in (("defocus_u", "rlnDefocusU"), ("defocus_v", "rlnDefocusV"),
                 ("defocus_angle", "rlnDefocusAngle"), ("voltage", "rlnVoltage"),
                 ("spherical_aberration", "rlnSphericalAberration"),
                 ("amplitude_contrast", "rlnAmplitudeContrast"),
                 ("pixel_size", "rlnImagePixelSize")):
        np.testing.assert_array_equal(getattr(ctf, f), ref[c].to_numpy(np.float64), err_msg=f)


def test_subtomogram_table(field):
    ctf, table = read_star(field / "sta_testing_bin8.star")
    assert len(ctf) == len(table) == 219


def test_relion30_without_amplitude_contrast(field):
    path = field / "FinalRefinement-OriginalParticles-PfCRT.star"
    with pytest.warns(UserWarning, match="no column rlnAmplitudeContrast; taking RELION's "
                                         "default 0.1"):
        ctf, table = read_star(path)
    assert len(ctf) == 5 and ctf.amplitude_contrast.tolist() == [0.1] * 5
    # RELION 3.0: detector pixel 1.035 um at magnification 10000
    np.testing.assert_allclose(ctf.pixel_size, 1.035, rtol=1e-12)
    np.testing.assert_array_equal(ctf.defocus_u, table["rlnDefocusU"].to_numpy(np.float64))


def test_cryodrgn_star_needs_the_pixel_size(field):
    path = field / "toy_projections.star"
    with pytest.raises(ValueError, match="toy_projections.star: no pixel size.*pass "
                                         r"pixel_size= \(--pixel-size"):
        read_star(path)
    ctf, _ = read_star(path, pixel_size=1.5, n_images=1000)
    assert ctf.pixel_size.tolist() == [1.5] * 1000
    assert set(ctf.phase_shift) == {90.0} and set(ctf.defocus_u) == {0.0}


def test_cs_is_the_star_file(field):
    """The ``.cs`` and the STAR file of the same 7 particles give the same CTF, to the float32
    precision of the ``.cs`` file."""
    from_cs, cs_table = read_cs(field / "empiar_10076_7.cs", n_images=7)
    from_star, _ = read_star(field / "empiar_10076_7.star", n_images=7)
    for f in CTF_FIELDS:
        np.testing.assert_allclose(getattr(from_cs, f), getattr(from_star, f), rtol=1e-7,
                                   atol=1e-12, err_msg=f)
    assert list(cs_table["rlnImageName"]) == [f"{i:06d}@empiar_10076_7.mrc"
                                              for i in range(1, 8)]


def test_cryosparc_particles(field):
    path = field / "cryosparc_P12_J24_001_particles.cs"
    ctf, table = read_cs(path)
    raw = np.load(path)
    assert len(ctf) == len(table) == 2019
    np.testing.assert_allclose(ctf.defocus_u, raw["ctf/df1_A"], rtol=1e-7)
    np.testing.assert_allclose(ctf.defocus_v, raw["ctf/df2_A"], rtol=1e-7)
    np.testing.assert_allclose(ctf.defocus_angle,
                               np.degrees(raw["ctf/df_angle_rad"].astype(np.float64)),
                               rtol=1e-6)
    np.testing.assert_allclose(ctf.pixel_size, raw["blob/psize_A"], rtol=1e-7)
    assert set(ctf.voltage) == {200.0} and set(ctf.amplitude_contrast) == {0.07}
    assert table["rlnImageName"][0].startswith("000001@J19/extract/")


# ----------------------------------------------------------------------------- command line
ARGS = ("--one-step", "--n-neighbors", 2, "--n-rotations", 8, "--no-refine", "--snr", 10,
        "--device", "cpu", "--quiet")


def _averages(out):
    with mrcfile.open(out / "class_averages.mrcs") as mrc:
        return np.array(mrc.data)


def test_class_averages_on_relion31(field, tmp_path, capsys):
    from _cli import call

    proc = call(capsys, "class-averages", field / "relion31.mrcs", "--star",
                field / "relion31.star", *ARGS, "--out", tmp_path / "r31")
    assert proc.returncode == 0, proc.stderr
    assert "no 'MAP ' ID string" in proc.stderr  # the warning, as one line
    averages = _averages(tmp_path / "r31")
    assert averages.shape == (5, 256, 256) and np.isfinite(averages).all()
    table = starfile.read(tmp_path / "r31" / "particles.star", always_dict=True)
    assert set(table) == {"optics", "particles"}
    assert list(table["particles"]["rlnClassNumber"]) == [1, 2, 3, 4, 5]


def test_class_averages_on_empiar_star_and_cs(field, tmp_path, capsys):
    from _cli import call

    for meta in ("empiar_10076_7.star", "empiar_10076_7.cs"):
        proc = call(capsys, "class-averages", field / "empiar_10076_7.mrc", "--star",
                    field / meta, *ARGS, "--out", tmp_path / meta)
        assert proc.returncode == 0, proc.stderr
        table = starfile.read(tmp_path / meta / "particles.star", always_dict=True)["particles"]
        assert list(table["rlnImageName"]) == [f"{i}@empiar_10076_7.mrc" if meta.endswith(
            ".star") else f"{i:06d}@empiar_10076_7.mrc" for i in range(1, 8)]
    star, cs = _averages(tmp_path / "empiar_10076_7.star"), _averages(tmp_path /
                                                                     "empiar_10076_7.cs")
    assert star.shape == (7, 320, 320)
    np.testing.assert_allclose(cs, star, atol=1e-5 * np.abs(star).max())
