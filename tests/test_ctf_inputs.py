"""Inputs of :mod:`invariant_cluster.ctf` as the field's files and a user's arrays bring them:
the spectral SNR's rings against a float64 full-FFT reference (and so under quarter turns),
float16 stacks, NumPy views of any strides, empty stacks, the forms of ``snr``, unavailable
devices, and the units of the CTF's parameters."""

import numpy as np
import pytest
import torch

from invariant_cluster import SteerableWiener, class_averages
from invariant_cluster._utils import resolve_device
from invariant_cluster.ctf import (
    CTF,
    apply_ctf,
    ctf_groups,
    ctf_images,
    phase_flip,
    spectral_snr,
    wiener_average,
    wiener_filter,
)
from invariant_cluster.denoise import DihedralPCA

pytestmark = pytest.mark.usefixtures("torch_single_thread")


def anisotropic(n, h, w, seed=0):
    """``n`` elongated Gaussian blobs (long along the rows), all their power off the
    diagonals: a spectrum that is not the same on the ``kx`` and ``ky`` axes."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[:h, :w].astype(np.float64)
    out = np.empty((n, h, w))
    for i in range(n):
        cy, cx = h / 2 + rng.uniform(-1, 1), w / 2 + rng.uniform(-1, 1)
        sy, sx = rng.uniform(3.0, 5.0), rng.uniform(0.8, 1.5)
        out[i] = np.exp(-(yy - cy) ** 2 / (2 * sy * sy) - (xx - cx) ** 2 / (2 * sx * sx))
    return out + rng.normal(0, 0.05, out.shape)


def some_ctf(n, seed=0, astigmatism=2000.0):
    rng = np.random.default_rng(seed)
    du = rng.uniform(1e4, 2.5e4, n)
    return CTF(du, du - astigmatism, rng.uniform(-90, 90, n), voltage=300, pixel_size=4.0)


def reference_spectral_snr(X, C, snr):
    """:func:`spectral_snr` with a number ``snr`` written out in float64 on the full FFT grid:
    ring means over every coefficient, each once."""
    n, h, w = X.shape
    noise = X.reshape(n, -1).var(1, ddof=1).mean() / (1 + snr) * h * w
    power = (np.abs(np.fft.fft2(X)) ** 2).mean(0)
    c2 = (C ** 2).mean(0)
    ring = np.round(np.hypot(np.fft.fftfreq(h)[:, None] * h,
                             np.fft.fftfreq(w)[None] * w)).astype(int)

    def radial(v):
        return (np.bincount(ring.ravel(), v.ravel()) / np.bincount(ring.ravel()))[ring]

    signal = np.maximum(radial(power) - noise, 0) / np.maximum(radial(c2), 1e-3)
    signal = np.maximum(signal, 1e-6 * signal.max() + 1e-30)
    return (signal / noise)[:, :w // 2 + 1]


# ----------------------------------------------------------------------------- spectral SNR
class TestSpectralSNRRings:
    @pytest.mark.parametrize("shape", [(16, 16), (17, 17), (16, 13), (15, 10)])
    def test_matches_the_full_fft(self, shape):
        X = anisotropic(12, *shape)
        ctf = some_ctf(12)
        C = ctf_images(ctf, shape).numpy()
        np.testing.assert_allclose(spectral_snr(X, ctf, snr=2.0).numpy(),
                                   reference_spectral_snr(X, C, 2.0), rtol=1e-9)
        np.testing.assert_allclose(spectral_snr(X, snr=2.0).numpy(),
                                   reference_spectral_snr(X, np.ones_like(X), 2.0), rtol=1e-9)

    @pytest.mark.parametrize("L", [16, 17])
    def test_quarter_turns_leave_the_rings(self, L):
        # a quarter turn of the images maps each ring of the full grid onto itself: the
        # estimate is the same (also with the noise measured, "auto")
        X = anisotropic(12, L, L)
        ctf = some_ctf(12)
        for k in (1, 2, 3):
            turned = np.rot90(X, k, axes=(1, 2))
            for snr in (2.0, "auto"):
                np.testing.assert_allclose(spectral_snr(turned, ctf, snr=snr).numpy(),
                                           spectral_snr(X, ctf, snr=snr).numpy(), rtol=1e-6)

    def test_class_averages_turn_with_the_images(self):
        # odd boxes: np.rot90 is a quarter turn about the Fourier centre, and the search's
        # quarter turns are exact; the averages of the turned stack are the turned averages
        rng = np.random.default_rng(0)
        X = anisotropic(3, 17, 17)
        X = np.stack([np.rot90(v, k) for v in X for k in range(4)])
        ctf = some_ctf(len(X), astigmatism=0.0)
        Y = (apply_ctf(X, ctf) + rng.normal(0, 0.3, X.shape)).astype(np.float32)
        kw = dict(n_neighbors=3, n_rotations=4, refine=False, ctf=ctf, snr="auto",
                  device="cpu")
        a = class_averages(Y, **kw)
        b = class_averages(np.rot90(Y, axes=(1, 2)), **kw)
        np.testing.assert_allclose(b, np.rot90(a, axes=(1, 2)), atol=1e-5 * np.abs(a).max())


# ----------------------------------------------------------------------------- float16
class TestHalfPrecision:
    def test_filters_take_float16(self):
        X = anisotropic(5, 16, 16).astype(np.float16)
        ctf = some_ctf(5)
        X32 = X.astype(np.float32)
        for f in (phase_flip, apply_ctf, wiener_filter, wiener_average):
            out = f(X, ctf)
            assert out.dtype == np.float16
            ref = f(X32, ctf)
            np.testing.assert_allclose(out.astype(np.float32), ref,
                                       atol=2e-3 * np.abs(ref).max())
            t = f(torch.from_numpy(X), ctf)
            assert t.dtype == torch.float16
            np.testing.assert_array_equal(t.numpy(), out)
        # the SNR spans more than float16's range: float32
        s = spectral_snr(X, ctf)
        assert s.dtype == torch.float32 and torch.isfinite(s).all()
        np.testing.assert_allclose(s.numpy(), spectral_snr(X32, ctf).numpy(), rtol=1e-5)
        b = phase_flip(torch.from_numpy(X32).to(torch.bfloat16), ctf)
        assert b.dtype == torch.bfloat16

    def test_ctf_images_in_float16(self):
        ctf = some_ctf(3)
        for half in (False, True):
            ref = ctf_images(ctf, (32, 32), half=half).numpy()
            for dtype in (torch.float16, torch.bfloat16):
                C = ctf_images(ctf, (32, 32), dtype=dtype, half=half)
                assert C.dtype == dtype and torch.isfinite(C).all()
                tol = 1e-3 if dtype == torch.float16 else 8e-3  # half a unit in the last place
                np.testing.assert_allclose(C.float().numpy(), ref, atol=tol)
        with pytest.raises(TypeError, match="^dtype:"):
            ctf_images(ctf, (8, 8), dtype=torch.int32)


# ----------------------------------------------------------------------------- strides
class TestViews:
    VIEWS = {"rot90": lambda X: np.rot90(X, axes=(1, 2)), "flip": np.flip,
             "reversed rows": lambda X: X[:, ::-1], "big-endian": lambda X: X.astype(">f8"),
             "read-only": lambda X: np.lib.stride_tricks.as_strided(X, writeable=False)}

    @pytest.mark.parametrize("view", VIEWS)
    def test_every_function_takes_views(self, view):
        X = anisotropic(4, 16, 16)
        V = self.VIEWS[view](X)
        ctf = some_ctf(4)
        copy = np.ascontiguousarray(V, dtype=np.float64)
        for f in (phase_flip, apply_ctf, wiener_filter, wiener_average):
            np.testing.assert_array_equal(f(V, ctf), f(copy, ctf))
        np.testing.assert_array_equal(spectral_snr(V, ctf).numpy(),
                                      spectral_snr(copy, ctf).numpy())
        snr = spectral_snr(X, ctf).numpy()
        np.testing.assert_array_equal(wiener_filter(X, ctf, snr=snr[::-1][::-1]),
                                      wiener_filter(X, ctf, snr=snr))

    def test_estimators_and_averages_take_views(self):
        X = anisotropic(12, 16, 16).astype(np.float32)
        V = np.rot90(X, axes=(1, 2))
        ctf = some_ctf(12)
        kw = dict(n_neighbors=2, n_rotations=4, refine=False, ctf=ctf, device="cpu")
        np.testing.assert_array_equal(class_averages(V, **kw),
                                      class_averages(np.ascontiguousarray(V), **kw))
        f = SteerableWiener(noise_std=0.1)
        np.testing.assert_array_equal(f.fit_transform(np.flip(X)),
                                      f.fit_transform(np.ascontiguousarray(np.flip(X))))


# ----------------------------------------------------------------------------- empty stacks
class TestEmpty:
    def test_filters_of_no_images_are_empty(self):
        ctf = some_ctf(4)[np.arange(0)]
        assert len(ctf) == 0
        for X in (np.zeros((0, 16, 12), np.float32), torch.zeros((0, 16, 12))):
            for f in (phase_flip, apply_ctf, wiener_filter):
                out = f(X, ctf)
                assert tuple(out.shape) == (0, 16, 12) and out.dtype == X.dtype
            assert wiener_filter(X, ctf, snr="auto").shape == (0, 16, 12)
        assert ctf_images(ctf, (16, 12)).shape == (0, 16, 12)
        with pytest.raises(ValueError, match=r"^snr: expected a number or an array of shape"):
            wiener_filter(np.zeros((0, 16, 12)), ctf, snr=np.ones((3, 3)))

    def test_nothing_to_measure_or_average(self):
        ctf = some_ctf(4)[np.arange(0)]
        with pytest.raises(ValueError, match="^images: expected at least one image"):
            spectral_snr(np.zeros((0, 16, 16)), ctf)
        with pytest.raises(ValueError, match="^images: expected at least one image"):
            spectral_snr(np.zeros((0, 16, 16)))
        with pytest.raises(ValueError, match="^images: expected at least one image"):
            wiener_average(np.zeros((0, 16, 16)), ctf)
        with pytest.raises(ValueError, match=r"^images: expected images of at least 1 x 1"):
            phase_flip(np.zeros((4, 0, 16)), some_ctf(4))

    def test_groups_of_no_images(self):
        labels, rep = ctf_groups(some_ctf(4)[np.arange(0)])
        assert labels.shape == (0,) and labels.dtype == np.int64 and len(rep) == 0


# ----------------------------------------------------------------------------- snr
class TestSNRForms:
    def test_auto_is_the_measured_spectral_snr(self):
        X = anisotropic(6, 16, 16)
        ctf = some_ctf(6)
        snr_k = spectral_snr(X, ctf).numpy()
        np.testing.assert_array_equal(wiener_filter(X, ctf, snr="auto"),
                                      wiener_filter(X, ctf, snr=snr_k))
        np.testing.assert_array_equal(wiener_average(X, ctf, snr="auto"),
                                      wiener_average(X, ctf, snr=snr_k))

    def test_zero_dimensional_arrays_are_numbers(self):
        X = anisotropic(6, 16, 16)
        ctf = some_ctf(6)
        for f in (wiener_filter, wiener_average):
            ref = f(X, ctf, snr=2.0)
            for snr in (np.array(2.0), np.float32(2.0), torch.tensor(2.0), np.array(2)):
                np.testing.assert_array_equal(f(X, ctf, snr=snr), ref)
        np.testing.assert_array_equal(spectral_snr(X, ctf, snr=np.array(2.0)).numpy(),
                                      spectral_snr(X, ctf, snr=2.0).numpy())

    @pytest.mark.parametrize("bad", [None, "2", "fast", b"2", True, np.array(True)])
    def test_other_forms_name_snr(self, bad):
        X = anisotropic(3, 8, 8)
        ctf = some_ctf(3)
        for f in (wiener_filter, wiener_average):
            with pytest.raises(TypeError, match="^snr:"):
                f(X, ctf, snr=bad)

    @pytest.mark.parametrize("bad", [0.0, -1.0, np.array(-2.0), float("nan")])
    def test_non_positive_numbers_name_snr(self, bad):
        with pytest.raises(ValueError, match="^snr:"):
            wiener_average(anisotropic(3, 8, 8), some_ctf(3), snr=bad)


# ----------------------------------------------------------------------------- devices
@pytest.mark.skipif(torch.backends.mps.is_available(), reason="MPS is available here")
class TestUnavailableDevice:
    @pytest.mark.parametrize("device", ["mps", torch.device("mps"), "mps:0"])
    def test_mps_names_the_device(self, device):
        with pytest.raises(ValueError, match="^device: .*MPS"):
            resolve_device(device)
        with pytest.raises(ValueError, match="^device:"):
            ctf_images(some_ctf(2), (8, 8), device=device)
        with pytest.raises(ValueError, match="^device:"):
            class_averages(anisotropic(4, 8, 8), n_neighbors=2, device=device)

    def test_cuda_past_the_last_gpu(self):
        with pytest.raises(ValueError, match="^device:"):
            resolve_device(f"cuda:{torch.cuda.device_count()}")
        if not torch.cuda.is_available():
            with pytest.raises(ValueError, match="^device: .*CUDA"):
                resolve_device(torch.device("cuda"))


# ----------------------------------------------------------------------------- units
class TestUnits:
    def test_volts_for_kilovolts(self):
        with pytest.raises(ValueError, match=r"^voltage: expected kV.*got 300000 .*volts"):
            CTF([2e4], voltage=300000)
        with pytest.raises(ValueError, match=r"^voltage: .*got 200000 at image 1"):
            CTF([2e4, 2e4], voltage=[300, 200000])
        assert CTF([2e4], voltage=1000).voltage[0] == 1000

    @pytest.mark.parametrize("kw, name", [(dict(defocus_u=[2.0]), "defocus_u"),
                                          (dict(defocus_u=[2e4, 1.5]), "defocus_u"),
                                          (dict(defocus_u=[2e4], defocus_v=[99.9]),
                                           "defocus_v")])
    def test_micrometres_for_angstrom(self, kw, name):
        with pytest.raises(ValueError, match=f"^{name}: expected ångström.*µm given for Å"):
            CTF(**kw)

    def test_zero_defocus_stays(self):
        # files of data without a CTF carry a defocus of 0: C is the amplitude-contrast term
        c = CTF([0.0, 100.0], amplitude_contrast=0.0)
        C = ctf_images(c[0], (8, 8))
        assert c.defocus_u.tolist() == [0.0, 100.0] and torch.isfinite(C).all()

    @pytest.mark.parametrize("kw, name", [
        (dict(defocus_u="20000"), "defocus_u"),
        (dict(defocus_u=["20000", "21000"]), "defocus_u"),
        (dict(defocus_u=[2e4], pixel_size="1.0"), "pixel_size"),
        (dict(defocus_u=[2e4], voltage=True), "voltage"),
        (dict(defocus_u=[True, False]), "defocus_u"),
        (dict(defocus_u=np.array([2e4, 2e4]), defocus_angle=np.array([True, False])),
         "defocus_angle"),
        (dict(defocus_u=torch.tensor([True])), "defocus_u"),
        (dict(defocus_u=np.array([2e4, "3e4"], dtype=object)), "defocus_u"),
        (dict(defocus_u=[2e4], phase_shift=1j), "phase_shift"),
    ])
    def test_text_and_bools_name_the_field(self, kw, name):
        with pytest.raises(TypeError, match=f"^{name}: expected real numbers"):
            CTF(**kw)

    def test_numbers_of_any_kind(self):
        c = CTF(np.array([2e4, 3e4], dtype=object), voltage=np.int32(200),
                pixel_size=torch.tensor([1.5, 2.0]))
        assert c.defocus_u.dtype == np.float64 and c.pixel_size.tolist() == [1.5, 2.0]

    @pytest.mark.parametrize("params", [np.zeros((3, 2)), np.zeros(3), np.zeros((3, 5)),
                                        np.zeros((4, 3)), np.zeros((3, 3, 1)),
                                        torch.zeros((3, 2))])
    def test_warped_params_shape(self, params):
        with pytest.raises(ValueError, match=r"^params: expected shape \(3, 3\) \(angle, tx, "
                                             r"ty\) or \(3, 4\)"):
            some_ctf(3).warped(params)

    def test_warped_params_values(self):
        with pytest.raises(ValueError, match="^params: contains NaN"):
            some_ctf(2).warped(np.array([[np.nan, 0, 0], [0, 0, 0]]))
        with pytest.raises(TypeError, match="^params:"):
            some_ctf(1).warped([["90", 0, 0]])
        w = some_ctf(2).warped(torch.tensor([[90.0, 0, 0], [0, 0, 0]]))
        np.testing.assert_allclose(w.defocus_angle, some_ctf(2).defocus_angle - [90.0, 0.0])


# ----------------------------------------------------------------------------- estimators
class TestEstimatorParameters:
    @pytest.mark.parametrize("kw", [dict(noise_std=True), dict(noise_std=np.bool_(False)),
                                    dict(radius=True)])
    def test_steerable_refuses_bools(self, kw):
        with pytest.raises(TypeError, match=next(iter(kw))):
            SteerableWiener(**kw).fit(anisotropic(10, 12, 12))

    def test_dihedral_pca_fitted_on_the_box(self):
        # with ctf the search turns 16 x 16 particles about pixel (8, 8), the geometric centre
        # of the frame padded to 17 x 17: a DihedralPCA fitted on the 16 x 16 box is
        # symmetric about (7.5, 7.5) and cannot serve; the message says what to do
        X = anisotropic(12, 16, 16).astype(np.float32)
        ctf = some_ctf(12)
        kw = dict(n_neighbors=2, n_rotations=4, refine=False, ctf=ctf, device="cpu")
        with pytest.raises(ValueError, match=r"^denoise: fitted on images of shape "
                                             r"\(1, 16, 16\), but with rotation_center="
                                             r"'fourier'.*padded to \(1, 17, 17\).*np\.pad"):
            class_averages(X, denoise=DihedralPCA(4).fit(X), **kw)
        # as it says: fitted on the padded (phase-flipped) images it is the one fitted here
        padded = np.pad(phase_flip(X, ctf), ((0, 0), (0, 1), (0, 1)))
        np.testing.assert_allclose(class_averages(X, denoise=DihedralPCA(4).fit(padded), **kw),
                                   class_averages(X, denoise=DihedralPCA(4), **kw), atol=1e-6)
        # other mismatches keep the plain message
        with pytest.raises(ValueError, match=r"^denoise: fitted on images of shape "
                                             r"\(1, 12, 12\), got \(1, 17, 17\)$"):
            class_averages(X, denoise=DihedralPCA(4).fit(X[:, :12, :12]), **kw)
