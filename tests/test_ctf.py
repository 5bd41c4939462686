"""The contrast transfer function (:mod:`invariant_cluster.ctf`) against an independent float64
formula, the CTF-corrected class averages, STAR files, and the rotation centre of even boxes."""

import math
import os

import numpy as np
import pytest
import torch

from invariant_cluster import aligned_neighbors, class_averages, warp_se2
from invariant_cluster.ctf import (
    CTF,
    apply_ctf,
    cross_ctf_filters,
    ctf_groups,
    ctf_images,
    phase_flip,
    read_cs,
    read_star,
    spectral_snr,
    star_tables,
    wiener_average,
    wiener_filter,
    write_star,
)
from invariant_cluster.transforms import centre_padding, rotation_centre

pytestmark = pytest.mark.usefixtures("torch_single_thread")


# ----------------------------------------------------------------------------- reference
def reference_ctf(h, w, *, du, dv, angle_deg, kv, cs_mm, amp, px, phase_deg=0.0):
    """RELION's ``CTF::getCTF`` written out in float64 NumPy (``-sin(K1 df u^2 + K2 u^4 - K5 -
    K3)`` with RELION's negative defocus), on ``np.fft.fftfreq``'s grid."""
    volts = kv * 1e3
    lam = 12.2643247 / math.sqrt(volts * (1.0 + volts * 0.978466e-6))
    K1 = math.pi * lam
    K2 = math.pi / 2.0 * cs_mm * 1e7 * lam ** 3
    K3 = math.atan(amp / math.sqrt(1.0 - amp ** 2))
    K5 = math.radians(phase_deg)
    Y, X = np.meshgrid(np.fft.fftfreq(h) / px, np.fft.fftfreq(w) / px, indexing="ij")
    u2 = X ** 2 + Y ** 2
    ellipse = np.arctan2(Y, X) - math.radians(angle_deg)
    deltaf = -(du + dv) / 2.0 + -(du - dv) / 2.0 * np.cos(2.0 * ellipse)
    return -np.sin(K1 * deltaf * u2 + K2 * u2 ** 2 - K5 - K3)


PARAMS = [dict(du=15000.0, dv=11000.0, angle_deg=34.4, kv=200.0, cs_mm=2.0, amp=0.1, px=5.0),
          dict(du=9000.0, dv=9000.0, angle_deg=0.0, kv=300.0, cs_mm=2.7, amp=0.07, px=1.1),
          dict(du=21000.0, dv=18000.0, angle_deg=-75.0, kv=300.0, cs_mm=0.01, amp=0.0, px=2.0,
               phase_deg=90.0)]


def as_ctf(p):
    return CTF([p["du"]], [p["dv"]], p["angle_deg"], p["kv"], p["cs_mm"], p["amp"], p["px"],
               p.get("phase_deg", 0.0))


def projection(L, seed=0, border=0):
    """A smooth random image (a sum of Gaussian blobs), zero within ``border`` pixels of the
    edges when ``border`` > 0."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[:L, :L].astype(np.float64)
    img = np.zeros((L, L))
    for _ in range(6):
        cy, cx = rng.uniform(0.3 * L, 0.7 * L, 2)
        s = rng.uniform(1.0, 0.08 * L)
        img += rng.uniform(0.5, 1.0) * np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / (2 * s * s))
    if border:
        img[:border] = img[-border:] = 0.0
        img[:, :border] = img[:, -border:] = 0.0
    return img


class TestCTFValues:
    @pytest.mark.parametrize("p", PARAMS)
    @pytest.mark.parametrize("shape", [(64, 64), (33, 33), (40, 48)])
    def test_matches_reference(self, p, shape):
        ours = ctf_images(as_ctf(p), shape, dtype=torch.float64)[0].numpy()
        ref = reference_ctf(*shape, **p)
        # (the Nyquist row and column of even sizes: test_nyquist_is_the_mean_of_its_aliases)
        rows = [i for i in range(shape[0]) if 2 * i != shape[0]]
        cols = [j for j in range(shape[1]) if 2 * j != shape[1]]
        np.testing.assert_allclose(ours[np.ix_(rows, cols)], ref[np.ix_(rows, cols)],
                                   atol=1e-10)

    def test_half_grid_is_rfft_columns(self):
        c = as_ctf(PARAMS[0])
        full = ctf_images(c, (32, 32))[0]
        half = ctf_images(c, (32, 32), half=True)[0]
        np.testing.assert_allclose(half.numpy(), full[:, :17].numpy(), atol=1e-12)

    def test_nyquist_is_the_mean_of_its_aliases(self):
        # on an even axis -1/2 is also +1/2: the filter must be the same at both (real images
        # stay real), and is the mean of the formula at the two
        p = PARAMS[0]
        C = ctf_images(as_ctf(p), (16, 16))[0].numpy()
        ref = reference_ctf(16, 16, **p)
        flipped = reference_ctf(16, 16, **{**p, "angle_deg": -p["angle_deg"]})  # ky -> -ky
        np.testing.assert_allclose(C[8, 1:8], 0.5 * (ref[8, 1:8] + flipped[8, 1:8]), atol=1e-12)
        np.testing.assert_allclose(C[8, 1:], C[8, 1:][::-1], atol=1e-12)  # kx <-> -kx
        np.testing.assert_allclose(C[1:, 8], C[1:, 8][::-1], atol=1e-12)

    def test_zero_frequency_is_amplitude_contrast(self):
        c = CTF([12000.0, 30000.0], amplitude_contrast=[0.1, 0.25])
        np.testing.assert_allclose(ctf_images(c, (16, 16))[:, 0, 0].numpy(), [0.1, 0.25])

    @pytest.mark.parametrize("j", [6, 11])
    def test_first_zero_where_predicted(self, j):
        # chi(k) = pi lam df k^2 - pi/2 Cs lam^3 k^4 + asin(A) = pi at the first zero: solved
        # for k^2, and the pixel size chosen so that k is the j-th frequency of a 64 box
        kv, cs, amp, df, L = 300.0, 2.7, 0.1, 20000.0, 64
        lam = 12.2643247 / math.sqrt(kv * 1e3 * (1.0 + kv * 1e3 * 0.978466e-6))
        a, b, c = -math.pi / 2 * cs * 1e7 * lam ** 3, math.pi * lam * df, math.asin(amp) - math.pi
        k2 = (-b + math.sqrt(b * b - 4 * a * c)) / (2 * a)
        px = j / (L * math.sqrt(k2))
        C = ctf_images(CTF([df], voltage=kv, spherical_aberration=cs, amplitude_contrast=amp,
                           pixel_size=px), (L, L))[0].numpy()
        assert abs(C[0, j]) < 1e-9 and abs(C[j, 0]) < 1e-9 and abs(C[0, -j]) < 1e-9
        # a sign change there: positive before the zero, negative after
        assert C[0, j - 1] > 0 > C[0, j + 1]
        assert (C[0, 1:j] > 0).all()

    def test_astigmatism_turns_with_the_angle(self):
        # defocus U along the angle: the CTF along direction phi with angle a equals the CTF
        # along phi - a with angle 0
        c0 = CTF([20000.0], [12000.0], 0.0, pixel_size=2.0)
        c90 = CTF([20000.0], [12000.0], 90.0, pixel_size=2.0)
        C0, C90 = (ctf_images(c, (32, 32))[0].numpy() for c in (c0, c90))
        np.testing.assert_allclose(C90, C0.T, atol=1e-12)  # the x and y axes swap
        assert not np.allclose(C0, C0.T, atol=1e-3)

    @pytest.mark.parametrize("params", [[90.0, 0, 0], [-90.0, 0, 0], [180.0, 0, 0],
                                        [0.0, 0, 0, 1], [90.0, 0, 0, 1]])
    def test_warp_commutes_with_ctf(self, params):
        # rot90 / flip are exact on the pixel grid: T(IFFT(C F(p))) = IFFT(C' F(T p)) with C'
        # the CTF turned by the warp (CTF.warped)
        p = projection(33)[None]
        c = CTF([18000.0], [11000.0], 27.0, voltage=200, pixel_size=3.0)
        lhs = warp_se2(apply_ctf(p, c), [params])
        rhs = apply_ctf(warp_se2(p, [params]), c.warped(np.array([params], float)))
        np.testing.assert_allclose(lhs, rhs, atol=1e-6)

    def test_float32_and_device(self):
        c = as_ctf(PARAMS[0])
        x = ctf_images(c, (16, 16), dtype=torch.float32)
        assert x.dtype == torch.float32 and x.device.type == "cpu"
        if torch.cuda.is_available():
            g = ctf_images(c, (16, 16), dtype=torch.float32, device="cuda")
            assert g.device.type == "cuda"
            np.testing.assert_allclose(g.cpu().numpy(), x.numpy(), atol=1e-5)


class TestFilters:
    def test_phase_flip_undoes_the_sign(self):
        p = projection(32)[None]
        c = as_ctf(PARAMS[0])
        C = ctf_images(c, (32, 32), half=True)[0].numpy()
        flipped = phase_flip(apply_ctf(p, c), c)
        np.testing.assert_allclose(np.fft.rfft2(flipped[0]), np.abs(C) * np.fft.rfft2(p[0]),
                                   atol=1e-9)
        # and a phase flip is its own inverse where the CTF is not zero
        y = apply_ctf(p, c)
        np.testing.assert_allclose(phase_flip(phase_flip(y, c), c), y, atol=1e-9)

    def test_wiener_filter_formula(self):
        p = projection(32)[None]
        c = as_ctf(PARAMS[1])
        C = ctf_images(c, (32, 32), half=True)[0].numpy()
        out = wiener_filter(p, c, snr=2.0)
        np.testing.assert_allclose(np.fft.rfft2(out[0]), C / (C ** 2 + 0.5) * np.fft.rfft2(p[0]),
                                   atol=1e-9)

    def test_average_of_defocus_series_recovers_the_projection(self):
        p = projection(48)
        ctf = CTF(np.linspace(10000.0, 25000.0, 7), voltage=200, spherical_aberration=2.0,
                  pixel_size=5.0)
        y = apply_ctf(np.stack([p] * 7), ctf)
        for one in y:  # each image alone is far from the projection (the CTF's sign flips)
            assert np.corrcoef(one.ravel(), p.ravel())[0, 1] < 0.9
        avg = wiener_average(y, ctf, snr=1e9)
        assert np.abs(avg - p).max() < 1e-5 * np.abs(p).max()

    def test_spectral_snr(self):
        # a defocus series of one projection plus white noise of known variance: the estimate
        # is the projection's radial power over the noise's, large at low frequencies, small
        # at high ones
        rng = np.random.default_rng(0)
        p = projection(32)
        ctf = CTF(np.linspace(10000.0, 25000.0, 200), voltage=200, pixel_size=5.0)
        clean = apply_ctf(np.stack([p] * 200), ctf)
        sigma2 = clean.var(axis=(1, 2)).mean()  # SNR 1
        noisy = clean + rng.normal(0, np.sqrt(sigma2), clean.shape)
        snr_k = spectral_snr(noisy, ctf, snr=1.0).numpy()
        assert snr_k.shape == (32, 17) and (snr_k > 0).all()
        assert snr_k[0, 1] > 100 * snr_k[16, 16]  # low against high frequencies
        # the projection's mean power on each ring of the full FFT over the noise's, within 20%
        P = np.abs(np.fft.fft2(p)) ** 2
        f = np.fft.fftfreq(32) * 32
        full_ring = np.round(np.hypot(f[None], f[:, None])).astype(int)
        ring = np.round(np.hypot(np.fft.rfftfreq(32)[None] * 32, f[:, None])).astype(int)
        for r in (1, 2, 3, 5):
            truth = P[full_ring == r].mean() / (sigma2 * 32 * 32)
            np.testing.assert_allclose(snr_k[ring == r], truth, rtol=0.2)
        # no noise: no regularisation left to speak of
        assert (spectral_snr(clean, ctf, snr=1e300).numpy() > 1e100).all()
        # a per-frequency snr in the filters; a wrong shape is refused
        out = wiener_average(noisy[:3], ctf[:3], snr=snr_k)
        assert out.shape == (32, 32)
        with pytest.raises(ValueError, match=r"snr: expected a number or an array of shape "
                                             r"\(32, 17\)"):
            wiener_filter(noisy[:3], ctf[:3], snr=np.ones((32, 32)))
        with pytest.raises(ValueError, match="snr: expected positive"):
            wiener_filter(noisy[:3], ctf[:3], snr=np.zeros((32, 17)))

    def test_torch_in_torch_out(self):
        c = as_ctf(PARAMS[0])
        x = torch.as_tensor(projection(16)[None], dtype=torch.float32)
        out = phase_flip(x, c)
        assert isinstance(out, torch.Tensor) and out.dtype == torch.float32


# ----------------------------------------------------------------------------- class averages
class TestClassAverages:
    def setup_data(self, L=33, n_views=2, copies=6, astig=True):
        """Copies of ``n_views`` projections, each turned by k * 90 degrees, each under its own
        CTF (defocus 10,000 to 25,000 A): the clean images, the CTF images and the truth."""
        views = [projection(L, seed=s, border=3) for s in range(n_views)]
        clean, label = [], []
        for v, img in enumerate(views):
            for c in range(copies):
                clean.append(np.rot90(img, c % 4))
                label.append(v)
        clean = np.stack(clean)
        n = len(clean)
        rng = np.random.default_rng(3)
        du = rng.uniform(10000.0, 25000.0, n)
        ctf = CTF(du, du - (3000.0 if astig else 0.0), rng.uniform(-90, 90, n), voltage=200,
                  spherical_aberration=2.0, pixel_size=5.0)
        return clean, apply_ctf(clean, ctf).astype(np.float32), ctf, np.array(label)

    def test_one_step_recovers_each_projection(self):
        clean, y, ctf, _ = self.setup_data()
        avg = class_averages(y, n_neighbors=5, ctf=ctf, snr=1e6, n_rotations=4, refine=False,
                             device="cpu")
        err = np.abs(avg - clean).max() / np.abs(clean).max()
        assert err < 1e-3
        # without the CTF correction the averages are far off
        plain = class_averages(y, n_neighbors=5, n_rotations=4, refine=False, device="cpu")
        assert np.abs(plain - clean).max() / np.abs(clean).max() > 0.3

    def test_one_step_with_round_and_astigmatic_ctfs(self):
        # the CTFs of images without astigmatism are computed once (a turn leaves them as they
        # are), the others turned per pair: a stack mixing both is recovered as well
        clean, _, ctf, _ = self.setup_data()
        dv = ctf.defocus_v.copy()
        dv[::2] = ctf.defocus_u[::2]
        mixed = CTF(ctf.defocus_u, dv, ctf.defocus_angle, voltage=200,
                    spherical_aberration=2.0, pixel_size=5.0)
        y = apply_ctf(clean, mixed).astype(np.float32)
        avg = class_averages(y, n_neighbors=5, ctf=mixed, snr=1e6, n_rotations=4,
                             refine=False, device="cpu")
        assert np.abs(avg - clean).max() / np.abs(clean).max() < 1e-3

    def test_labels_recover_each_view(self):
        clean, y, ctf, label = self.setup_data()
        means, tau = class_averages(y, labels=label, ctf=ctf, snr=1e6, n_rotations=4,
                                    refine=False, device="cpu", return_alignments=True)
        assert means.shape == (2, 33, 33) and tau.shape == (len(y), 3)
        for v in range(2):
            truth = clean[label == v][0]
            err = min(np.abs(means[v] - np.rot90(truth, k)).max() for k in range(4))
            assert err < 1e-3 * np.abs(truth).max()
            # each image's alignment maps its clean image onto the class's average
            members = np.flatnonzero(label == v)
            warped = warp_se2(clean[members].astype(np.float32), tau[members])
            assert np.abs(warped - means[v]).max() < 1e-3 * np.abs(truth).max()

    def test_wiener_average_without_ctf(self):
        # C = 1: with no noise the Wiener estimate is the plain mean; on noisy copies the
        # measured noise ("auto") makes it closer to the projections than the plain mean
        clean, _, _, _ = self.setup_data(copies=8)
        clean = clean.astype(np.float32)
        plain = class_averages(clean, n_neighbors=7, n_rotations=4, refine=False, device="cpu")
        w = class_averages(clean, n_neighbors=7, n_rotations=4, refine=False, snr=1e12,
                           device="cpu")
        np.testing.assert_allclose(w, plain, atol=1e-5)
        rng = np.random.default_rng(5)
        noisy = clean + rng.normal(0, 0.5 * clean.std(), clean.shape).astype(np.float32)
        plain = class_averages(noisy, n_neighbors=7, n_rotations=4, refine=False, device="cpu")
        auto = class_averages(noisy, n_neighbors=7, n_rotations=4, refine=False, snr="auto",
                              device="cpu")
        assert np.linalg.norm(auto - clean) < 0.8 * np.linalg.norm(plain - clean)

    def test_search_on_phase_flipped_images(self):
        _, y, ctf, label = self.setup_data(copies=8)
        ind, _ = aligned_neighbors(y, n_neighbors=7, ctf=ctf, n_rotations=4, refine=False,
                                   device="cpu")
        assert (label[ind] == label[:, None]).all()

    def test_bad_ctf_arguments(self):
        _, y, ctf, _ = self.setup_data()
        with pytest.raises(ValueError, match="ctf: expected the parameters of 12 images"):
            class_averages(y, n_neighbors=3, ctf=ctf[:5], n_rotations=4, device="cpu")
        with pytest.raises(TypeError, match="ctf: expected an invariant_cluster.ctf.CTF"):
            class_averages(y, n_neighbors=3, ctf={"defocus_u": 1.0}, device="cpu")
        with pytest.raises(ValueError, match="snr"):
            class_averages(y, n_neighbors=3, ctf=ctf, snr=0.0, device="cpu")
        with pytest.raises(ValueError, match="rotation_center"):
            class_averages(y, n_neighbors=3, rotation_center="middle", device="cpu")
        with pytest.raises(ValueError, match="ctf: only for single-channel"):
            class_averages(np.stack([y, y], 1), n_neighbors=3, ctf=ctf, device="cpu")
        with pytest.raises(ValueError, match="snr: only for single-channel"):
            class_averages(np.stack([y, y], 1), n_neighbors=3, snr="auto", device="cpu")
        with pytest.raises(TypeError, match="snr"):
            class_averages(y, n_neighbors=3, snr="high", device="cpu")


class TestCrossCTF:
    """The search across CTF groups: images of one projection under two defocus values
    filtered to the same image (an independent float64 formula), and the neighbours that
    phase flipping alone gets wrong."""

    KW = dict(voltage=200.0, spherical_aberration=2.0, pixel_size=5.0)

    def test_distinct_ctfs_are_the_groups(self):
        df = np.array([20000.0, 15000.0, 20000.0, 17000.0, 15000.0, 17000.0])
        labels, rep = ctf_groups(CTF(df, **self.KW))
        np.testing.assert_array_equal(labels, [2, 0, 2, 1, 0, 1])  # in defocus order
        np.testing.assert_array_equal(rep.defocus_u, [15000.0, 17000.0, 20000.0])
        np.testing.assert_array_equal(rep.voltage, 200.0)

    def test_more_ctfs_are_cut_at_quantiles(self):
        rng = np.random.default_rng(0)
        du = rng.uniform(10000.0, 30000.0, 40)
        dv = du - rng.uniform(0.0, 2000.0, 40)
        ctf = CTF(du, dv, rng.uniform(-90, 90, 40), **self.KW)
        labels, rep = ctf_groups(ctf, 4)
        mean = (du + dv) / 2
        assert np.bincount(labels).tolist() == [10, 10, 10, 10]
        for g in range(3):  # contiguous, disjoint ranges in defocus order
            assert mean[labels == g].max() < mean[labels == g + 1].min()
        for g in range(4):  # the median member, its astigmatism removed
            members = np.sort(mean[labels == g])
            assert rep.defocus_u[g] == rep.defocus_v[g] == members[(len(members) - 1) // 2]
        np.testing.assert_array_equal(rep.defocus_angle, 0.0)
        # equal values stay in one group
        same = np.r_[np.full(10, 15000.0), [16000.0, 17000.0, 18000.0, 19000.0]]
        labels, _ = ctf_groups(CTF(same, **self.KW), 4)
        assert len(set(labels[:10])) == 1

    def test_filters_make_the_copies_equal(self):
        L, eps = 32, 1e-3
        p = projection(L, seed=2)
        ctf = CTF([12000.0, 24000.0], **self.KW)
        f = cross_ctf_filters(ctf, (L, L)).numpy()
        # against RELION's formula in float64 (the half grid of rfft2)
        C = [reference_ctf(L, L, du=d, dv=d, angle_deg=0.0, kv=200.0, cs_mm=2.0, amp=0.1,
                           px=5.0)[:, :L // 2 + 1] for d in (12000.0, 24000.0)]
        for g in range(2):
            for h in range(2):
                want = np.abs(C[h]) / np.sqrt(C[g] ** 2 + C[h] ** 2 + eps)
                np.testing.assert_allclose(f[g, h], want, atol=1e-6)
        flipped = phase_flip(apply_ctf(np.stack([p, p]), ctf), ctf)
        a, b = (np.fft.irfft2(np.fft.rfft2(flipped[i]) * f[i, 1 - i], s=(L, L)) for i in (0, 1))
        np.testing.assert_allclose(a, b, atol=1e-10 * np.abs(p).max())
        assert np.abs(flipped[0] - flipped[1]).max() > 0.1 * np.abs(p).max()

    @pytest.mark.parametrize("search", ["auto", "shortlist"])
    @pytest.mark.parametrize("refine", [False, True])
    def test_neighbours_across_defocus(self, refine, search):
        # "auto": every pair of groups searched (few images); "shortlist": the candidates of
        # the phase-flipped images aligned with the groups' filters
        # two close views, 8 quarter-turned copies each, half at 1 um and half at 2.5 um
        a = projection(33, seed=0, border=3)
        views = [a, a + 0.3 * projection(33, seed=1, border=3)]
        clean = np.stack([np.rot90(v, c % 4) for v in views for c in range(8)])
        label = np.repeat([0, 1], 8)
        ctf = CTF(np.tile(np.repeat([10000.0, 25000.0], 4), 2), **self.KW)
        y = apply_ctf(clean, ctf).astype(np.float32)
        kw = dict(n_neighbors=7, ctf=ctf, n_rotations=4, refine=refine, device="cpu",
                  neighbor_search=search)
        ind, tau = aligned_neighbors(y, **kw)
        assert (label[ind] == label[:, None]).all()
        # the alignments still map each neighbour onto its image (quarter turns)
        for i in range(len(y)):
            for j, t in zip(ind[i], tau[i]):
                warped = warp_se2(clean[j][None].astype(np.float32), t[None])[0]
                np.testing.assert_allclose(warped, clean[i], atol=1e-4)
        # phase flipping alone pairs the images of one defocus
        ind1, _ = aligned_neighbors(y, ctf_groups=1, **kw)
        assert (label[ind1] == label[:, None]).mean() < 0.6
        # the averages of class_averages follow the same search
        avg = class_averages(y, snr=1e6, **kw)
        assert np.abs(avg - clean).max() < 1e-3 * np.abs(clean).max()

    @pytest.mark.parametrize("search", ["auto", "shortlist"])
    def test_centred_across_defocus(self, search):
        # the same with copies shifted by up to 2 px and centre=True: each image is centred
        # once (by its phase-flipped copy), and the alignments still map the images given
        a = projection(33, seed=0, border=4)
        views = [a, a + 0.3 * projection(33, seed=1, border=4)]
        shifts = np.random.default_rng(0).integers(-2, 3, (16, 2))
        clean = np.stack([np.roll(np.rot90(v, c % 4), tuple(shifts[8 * i + c]), axis=(0, 1))
                          for i, v in enumerate(views) for c in range(8)])
        label = np.repeat([0, 1], 8)
        ctf = CTF(np.tile(np.repeat([10000.0, 25000.0], 4), 2), **self.KW)
        y = apply_ctf(clean, ctf).astype(np.float32)
        kw = dict(n_neighbors=7, ctf=ctf, n_rotations=4, max_translation=1, center=True,
                  device="cpu", neighbor_search=search)
        ind, tau = aligned_neighbors(y, **kw)
        assert (label[ind] == label[:, None]).all()
        err = max(np.abs(warp_se2(clean[j][None].astype(np.float32), t[None])[0] - clean[i]).max()
                  for i in range(len(y)) for j, t in zip(ind[i], tau[i]))
        assert err < 0.02 * np.abs(clean).max()
        ind1, _ = aligned_neighbors(y, ctf_groups=1, **kw)
        assert (label[ind1] == label[:, None]).mean() < 0.6

    def test_shortlisted_search_matches_exhaustive_reference(self):
        # the shortlisted search across groups aligns, with the groups' filters, only the
        # candidates that the descriptors of the phase-flipped images list (64 of 99 here): on
        # 100 images of 5 views, each under 4 defocus values and 4 quarter turns, it keeps the
        # neighbours of every pair compared across groups, in float64 (the cross filters
        # written out from RELION's formula)
        L, k, eps = 33, 5, 1e-3
        dfs = [10000.0, 15000.0, 20000.0, 25000.0]
        views = [projection(L, seed=s, border=3) for s in range(5)]
        clean = np.stack([np.rot90(v, c % 4) for v in views for c in range(20)])
        df = np.tile([dfs[(c // 4) % 4] for c in range(20)], 5)
        ctf = CTF(df, **self.KW)
        rng = np.random.default_rng(0)
        y = apply_ctf(clean, ctf) + rng.normal(0, 0.03 * np.abs(clean).max(), clean.shape)
        y = y.astype(np.float32)
        C = {d: reference_ctf(L, L, du=d, dv=d, angle_deg=0.0, kv=200.0, cs_mm=2.0, amp=0.1,
                              px=5.0) for d in dfs}
        F = np.fft.fft2(y.astype(np.float64))
        n = len(y)
        ref = np.full((n, n), np.inf)
        for i in range(n):
            for j in range(n):
                if i != j:
                    ci, cj = C[df[i]], C[df[j]]
                    den = np.sqrt(ci ** 2 + cj ** 2 + eps)
                    a = np.fft.ifft2(F[i] * np.sign(ci) * np.abs(cj) / den).real
                    b = np.fft.ifft2(F[j] * np.sign(cj) * np.abs(ci) / den).real
                    ref[i, j] = min(((a - np.rot90(b, r)) ** 2).sum() for r in range(4))
        kw = dict(n_neighbors=k, ctf=ctf, n_rotations=4, refine=False, device="cpu")
        ind, tau = aligned_neighbors(y, neighbor_search="shortlist", **kw)
        want = np.sort(ref, 1)[:, :k]
        got = np.sort(np.take_along_axis(ref, ind, 1), 1)
        np.testing.assert_allclose(got, want, rtol=1e-4)
        # the quarter turns found map each neighbour's clean view onto the image's
        view = np.repeat(np.arange(5), 20)
        assert (view[ind] == view[:, None]).all()
        for i in range(n):
            for j, t in zip(ind[i], tau[i]):
                warped = warp_se2(clean[j][None].astype(np.float32), t[None])[0]
                np.testing.assert_allclose(warped, clean[i], atol=1e-4)
        # the exhaustive search of every pair of groups finds the same
        ind_all, _ = aligned_neighbors(y, neighbor_search="exact", **kw)
        np.testing.assert_allclose(np.sort(np.take_along_axis(ref, ind_all, 1), 1), want,
                                   rtol=1e-4)
        # and the phase-flipped images alone do not
        ind1, _ = aligned_neighbors(y, ctf_groups=1, **kw)
        assert not np.allclose(np.sort(np.take_along_axis(ref, ind1, 1), 1), want, rtol=1e-4)

    @pytest.mark.parametrize("bad", [0, -2, 1.5, True, "4"])
    def test_bad_ctf_groups(self, bad):
        y = np.zeros((4, 9, 9), np.float32)
        ctf = CTF(np.full(4, 15000.0), **self.KW)
        with pytest.raises(ValueError, match="ctf_groups"):
            aligned_neighbors(y, n_neighbors=2, ctf=ctf, ctf_groups=bad, device="cpu")
        with pytest.raises(ValueError, match="ctf_groups"):
            class_averages(y, n_neighbors=2, ctf=ctf, ctf_groups=bad, device="cpu")
        with pytest.raises(ValueError, match="ctf_groups"):
            ctf_groups(ctf, bad)


class TestCTFParameters:
    @pytest.mark.parametrize("kw, name", [
        (dict(defocus_u=[-1e4, 2e4]), "defocus_u"),
        (dict(defocus_u=[1e4, 2e4], defocus_v=[1e4, -5e4]), "defocus_v"),
        (dict(defocus_u=[1e4, 2e4], pixel_size=0.0), "pixel_size"),
        (dict(defocus_u=[1e4, 2e4], pixel_size=[1.0, -1.0]), "pixel_size"),
        (dict(defocus_u=[1e4, 2e4], voltage=0.0), "voltage"),
        (dict(defocus_u=[1e4, 2e4], amplitude_contrast=1.0), "amplitude_contrast"),
        (dict(defocus_u=[1e4, 2e4], defocus_angle=[1.0, 2.0, 3.0]), "defocus_angle"),
        (dict(defocus_u=[1e4, np.nan]), "defocus_u"),
        (dict(defocus_u=np.full((2, 2), 1e4)), "defocus_u"),
    ])
    def test_bad_values_name_the_argument(self, kw, name):
        with pytest.raises(ValueError, match=f"^{name}:"):
            CTF(**kw)

    def test_not_numbers(self):
        with pytest.raises(TypeError, match="^voltage:"):
            CTF([1e4], voltage="high")

    def test_indexing_and_broadcast(self):
        c = CTF([1e4, 2e4, 3e4], pixel_size=1.5)
        assert len(c) == 3 and c.pixel_size.tolist() == [1.5] * 3
        assert c[1:].defocus_u.tolist() == [2e4, 3e4] and len(c[0]) == 1

    def test_warped_angles(self):
        c = CTF([2e4, 2e4], [1e4, 1e4], [30.0, 30.0])
        w = c.warped(np.array([[90.0, 1.0, 2.0, 0.0], [90.0, 0.0, 0.0, 1.0]]))
        assert w.defocus_angle.tolist() == [-60.0, -120.0]


# ----------------------------------------------------------------------------- STAR files
starfile = pytest.importorskip("starfile")


class TestStar:
    def ctf(self, n=5):
        rng = np.random.default_rng(0)
        return CTF(rng.uniform(1e4, 2e4, n), rng.uniform(1e4, 2e4, n), rng.uniform(-90, 90, n),
                   voltage=np.where(np.arange(n) < 2, 200.0, 300.0), spherical_aberration=2.7,
                   amplitude_contrast=0.1, pixel_size=1.2)

    def test_round_trip(self, tmp_path):
        c = self.ctf()
        optics, particles = star_tables(c)
        assert len(optics) == 2
        particles.insert(0, "rlnImageName", [f"{i + 1:06d}@particles.mrcs" for i in range(5)])
        write_star(tmp_path / "p.star", particles, optics=optics)
        back, table = read_star(tmp_path / "p.star", n_images=5)
        for f in ("defocus_u", "defocus_v", "defocus_angle", "voltage", "spherical_aberration",
                  "amplitude_contrast", "pixel_size", "phase_shift"):
            np.testing.assert_allclose(getattr(back, f), getattr(c, f), rtol=1e-6, err_msg=f)
        assert list(table["rlnImageName"]) == list(particles["rlnImageName"])
        # starfile reads it back with the blocks RELION expects
        blocks = starfile.read(tmp_path / "p.star", always_dict=True)
        assert set(blocks) == {"optics", "particles"}

    def test_relion_30_single_table(self, tmp_path):
        text = """
data_

loop_
_rlnImageName #1
_rlnDefocusU #2
_rlnDefocusV #3
_rlnDefocusAngle #4
_rlnVoltage #5
_rlnSphericalAberration #6
_rlnAmplitudeContrast #7
_rlnDetectorPixelSize #8
_rlnMagnification #9
000001@p.mrcs 15000.0 14000.0 10.0 300.0 2.7 0.1 5.0 10000.0
000002@p.mrcs 16000.0 15500.0 20.0 300.0 2.7 0.1 5.0 10000.0
"""
        (tmp_path / "old.star").write_text(text)
        c, _ = read_star(tmp_path / "old.star")
        assert c.defocus_u.tolist() == [15000.0, 16000.0]
        np.testing.assert_allclose(c.pixel_size, [5.0, 5.0])
        assert c.phase_shift.tolist() == [0.0, 0.0]

    def write(self, tmp_path, mutate):
        optics, particles = star_tables(self.ctf())
        mutate(optics, particles)
        path = tmp_path / "bad.star"
        write_star(path, particles, optics=optics)
        return path

    @pytest.mark.parametrize("column", ["rlnDefocusU", "rlnDefocusAngle", "rlnVoltage",
                                        "rlnSphericalAberration", "rlnImagePixelSize"])
    def test_missing_column_is_named(self, tmp_path, column):
        def drop(optics, particles):
            for t in (optics, particles):
                if column in t:
                    del t[column]
        path = self.write(tmp_path, drop)
        with pytest.raises(ValueError, match=f"missing column {column}"):
            read_star(path)

    def test_column_not_numbers(self, tmp_path):
        def text(optics, particles):
            particles["rlnDefocusV"] = ["abc"] * len(particles)
        with pytest.raises(ValueError, match="column rlnDefocusV holds values that are not"):
            read_star(self.write(tmp_path, text))

    def test_negative_defocus_and_pixel_size(self, tmp_path):
        def negative(optics, particles):
            particles.loc[2, "rlnDefocusU"] = -100.0
        with pytest.raises(ValueError, match="column rlnDefocusU: expected non-negative.*image 2"):
            read_star(self.write(tmp_path, negative))

        def zero_pixel(optics, particles):
            optics["rlnImagePixelSize"] = 0.0
        with pytest.raises(ValueError, match="column rlnImagePixelSize: expected positive"):
            read_star(self.write(tmp_path, zero_pixel))

    def test_rows_must_match_the_stack(self, tmp_path):
        path = self.write(tmp_path, lambda o, p: None)
        with pytest.raises(ValueError, match="bad.star: has 5 particle rows, expected 7"):
            read_star(path, n_images=7)

    def test_unknown_optics_group(self, tmp_path):
        def orphan(optics, particles):
            particles.loc[0, "rlnOpticsGroup"] = 9
        with pytest.raises(ValueError, match=r"rlnOpticsGroup \[9\]"):
            read_star(self.write(tmp_path, orphan))

    def test_not_a_star_file(self, tmp_path):
        with pytest.raises(FileNotFoundError):
            read_star(tmp_path / "nothing.star")

    def test_nothing_written_half(self, tmp_path, monkeypatch):
        path = tmp_path / "out.star"
        path.write_text("old\n")
        optics, particles = star_tables(self.ctf())

        def broken(*args, **kwargs):
            with open(args[1], "w") as fh:
                fh.write("data_\nloop_\n_rlnDef")  # a partial file, then a failure
            raise OSError("disk full")

        monkeypatch.setattr(starfile, "write", broken)
        with pytest.raises(OSError, match="disk full"):
            write_star(path, particles, optics=optics)
        assert path.read_text() == "old\n"
        assert sorted(os.listdir(tmp_path)) == ["out.star"]


    def test_duplicated_optics_group(self, tmp_path):
        # a group listed twice multiplied its particles: particle i got particle i // 2's CTF
        def twice(optics, particles):
            optics.loc[len(optics)] = optics.iloc[1].tolist()
        path = self.write(tmp_path, twice)
        with pytest.raises(ValueError, match=r"bad.star: data_optics lists rlnOpticsGroup 2 "
                                             "more than once"):
            read_star(path, n_images=5)

    def test_text_optics_group_ids(self, tmp_path):
        c = self.ctf()

        def names(optics, particles):  # groups named by text on both sides
            optics["rlnOpticsGroup"] = ["g1", "g2"]
            particles["rlnOpticsGroup"] = ["g1" if i == 1 else "g2"
                                           for i in particles["rlnOpticsGroup"]]
        back, _ = read_star(self.write(tmp_path, names), n_images=5)
        np.testing.assert_array_equal(back.voltage, c.voltage)

        def mixed(optics, particles):  # "1" in a text column is the particles' group 1
            optics["rlnOpticsGroup"] = ["1", "other"]
            particles["rlnOpticsGroup"] = 1
        back, _ = read_star(self.write(tmp_path, mixed))
        np.testing.assert_array_equal(back.voltage, [c.voltage[0]] * 5)

        def unknown(optics, particles):
            particles["rlnOpticsGroup"] = [1, 2, 2, 2, "x"]
        with pytest.raises(ValueError, match=r"bad.star: rlnOpticsGroup \['x'\] not in the "
                                             "data_optics block"):
            read_star(self.write(tmp_path, unknown))

    def test_truncated_last_row(self, tmp_path):
        path = self.write(tmp_path, lambda o, p: None)
        text = path.read_text().rstrip()
        path.write_text(text[:text.rindex("\t")] + "\n")  # the last value cut off
        with pytest.raises(ValueError, match="bad.star: the last row of data_particles is "
                                             r"incomplete, 4 of its 5 values \(is the file "
                                             "truncated"):
            read_star(path)

    @pytest.mark.parametrize("n, error", [("3", TypeError), (3.0, TypeError),
                                          (True, TypeError), (-1, ValueError)])
    def test_n_images_is_checked(self, tmp_path, n, error):
        path = self.write(tmp_path, lambda o, p: None)
        with pytest.raises(error, match="n_images: expected"):
            read_star(path, n_images=n)
        assert len(read_star(path, n_images=np.int64(5))[0]) == 5

    def test_a_folder(self, tmp_path):
        with pytest.raises(IsADirectoryError, match=f"{tmp_path}: a folder"):
            read_star(tmp_path)

    def test_one_particle_as_key_value_pairs(self, tmp_path):
        path = tmp_path / "one.star"
        path.write_text("data_particles\n\n_rlnImageName 1@p.mrcs\n_rlnDefocusU 15000.5\n"
                        "_rlnDefocusV 14000\n_rlnDefocusAngle 12.5\n_rlnVoltage 300\n"
                        "_rlnSphericalAberration 2.7\n_rlnAmplitudeContrast 0.07\n"
                        "_rlnImagePixelSize 1.5\n")
        c, table = read_star(path, n_images=1)
        assert (c.defocus_u.tolist(), c.defocus_v.tolist(), c.defocus_angle.tolist(),
                c.amplitude_contrast.tolist(), c.pixel_size.tolist()) == (
            [15000.5], [14000.0], [12.5], [0.07], [1.5])
        assert list(table["rlnImageName"]) == ["1@p.mrcs"]

    def test_relion_30_without_amplitude_contrast(self, tmp_path):
        def drop(optics, particles):
            del optics["rlnAmplitudeContrast"]
        with pytest.warns(UserWarning, match="no column rlnAmplitudeContrast; taking "
                                             "RELION's default 0.1"):
            c, _ = read_star(self.write(tmp_path, drop))
        assert c.amplitude_contrast.tolist() == [0.1] * 5

    def test_pixel_size_argument(self, tmp_path):
        path = self.write(tmp_path, lambda o, p: None)
        assert read_star(path, pixel_size=2.5)[0].pixel_size.tolist() == [2.5] * 5

        def drop(optics, particles):
            del optics["rlnImagePixelSize"]
        none = self.write(tmp_path, drop)
        with pytest.raises(ValueError, match="bad.star: no pixel size.*pass pixel_size= "
                                             r"\(--pixel-size"):
            read_star(none)
        assert read_star(none, pixel_size=3)[0].pixel_size.tolist() == [3.0] * 5
        for bad, error in (("1.5", TypeError), (True, TypeError), (0.0, ValueError),
                           (float("nan"), ValueError)):
            with pytest.raises(error, match="pixel_size: expected a positive number"):
                read_star(none, pixel_size=bad)

    def test_full_precision(self, tmp_path):
        c = CTF([15000.123456789012, 12345.678901234567], voltage=300, pixel_size=1.0000001,
                phase_shift=[4e-7, 1 / 3], defocus_angle=[1 / 7, -89.99999999])
        optics, particles = star_tables(c)
        write_star(tmp_path / "p.star", particles, optics=optics)
        back, _ = read_star(tmp_path / "p.star")
        for f in ("defocus_u", "defocus_v", "defocus_angle", "voltage", "pixel_size",
                  "phase_shift"):
            assert getattr(back, f).tolist() == getattr(c, f).tolist(), f

    def test_write_through_a_symlink_keeps_it_and_the_mode(self, tmp_path):
        optics, particles = star_tables(self.ctf())
        target = tmp_path / "job1" / "particles.star"
        target.parent.mkdir()
        target.write_text("old\n")
        os.chmod(target, 0o600)
        link = tmp_path / "job2.star"
        link.symlink_to(target)
        write_star(link, particles, optics=optics)
        assert link.is_symlink() and os.readlink(link) == str(target)
        assert len(read_star(target)[0]) == 5
        assert oct(os.stat(target).st_mode & 0o777) == oct(0o600)
        assert sorted(os.listdir(target.parent)) == ["particles.star"]

    def test_failed_write_names_the_target(self, tmp_path, monkeypatch):
        path = tmp_path / "out.star"
        optics, particles = star_tables(self.ctf())

        def full(blocks, filename, **kwargs):  # as a real write into the temporary file
            raise OSError(28, "No space left on device", str(filename))

        monkeypatch.setattr(starfile, "write", full)
        with pytest.raises(OSError) as info:
            write_star(path, particles, optics=optics)
        message = str(info.value)
        assert message.startswith(f"{path}: cannot write") and "No space left" in message
        assert ".star." not in message.replace(str(path), "")  # not the temporary file
        assert os.listdir(tmp_path) == []


class TestCryoSparc:
    def write(self, tmp_path, drop=(), n=4):
        """A ``.cs`` file (NumPy structured array, cryoSPARC's fields, float32)."""
        rng = np.random.default_rng(1)
        fields = [("uid", "<u8"), ("blob/path", "S20"), ("blob/idx", "<u4"),
                  ("blob/psize_A", "<f4"), ("ctf/accel_kv", "<f4"), ("ctf/cs_mm", "<f4"),
                  ("ctf/amp_contrast", "<f4"), ("ctf/df1_A", "<f4"), ("ctf/df2_A", "<f4"),
                  ("ctf/df_angle_rad", "<f4"), ("ctf/phase_shift_rad", "<f4"),
                  ("ctf/tilt_A", "<f4", (2,))]
        data = np.zeros(n, [f for f in fields if f[0] not in drop])
        values = {"blob/path": b">J1/stack.mrc", "blob/idx": np.arange(n),
                  "blob/psize_A": 1.31, "ctf/accel_kv": 300, "ctf/cs_mm": 2.7,
                  "ctf/amp_contrast": 0.07, "ctf/df1_A": rng.uniform(1e4, 2e4, n),
                  "ctf/df2_A": rng.uniform(1e4, 2e4, n),
                  "ctf/df_angle_rad": rng.uniform(-1.5, 1.5, n),
                  "ctf/phase_shift_rad": [0.0, math.pi / 2] * (n // 2)}
        for k, v in values.items():
            if k not in drop:
                data[k] = v
        path = tmp_path / "particles.cs"
        with open(path, "wb") as fh:
            np.save(fh, data)
        return path, data

    def test_fields(self, tmp_path):
        path, data = self.write(tmp_path)
        c, table = read_cs(path, n_images=4)
        f32 = data.dtype["ctf/df1_A"].type
        np.testing.assert_array_equal(c.defocus_u.astype(f32), data["ctf/df1_A"])
        np.testing.assert_array_equal(c.defocus_v.astype(f32), data["ctf/df2_A"])
        np.testing.assert_allclose(c.defocus_angle, np.degrees(data["ctf/df_angle_rad"]
                                                               .astype(np.float64)), rtol=1e-6)
        np.testing.assert_allclose(c.phase_shift, [0.0, 90.0, 0.0, 90.0], atol=1e-5)
        # float32 0.07, 1.31 and 2.7 read back as the decimals a STAR file would hold
        assert (c.amplitude_contrast.tolist(), c.pixel_size.tolist(),
                c.spherical_aberration.tolist(), c.voltage.tolist()) == (
            [0.07] * 4, [1.31] * 4, [2.7] * 4, [300.0] * 4)
        assert list(table["rlnImageName"]) == [f"{i:06d}@J1/stack.mrc" for i in range(1, 5)]
        assert read_cs(path, pixel_size=2.0)[0].pixel_size.tolist() == [2.0] * 4
        # its table is a RELION 3.0 STAR file of the same CTF
        write_star(tmp_path / "p.star", table)
        back, _ = read_star(tmp_path / "p.star", n_images=4)
        for f in ("defocus_u", "defocus_v", "defocus_angle", "voltage", "spherical_aberration",
                  "amplitude_contrast", "pixel_size", "phase_shift"):
            assert getattr(back, f).tolist() == getattr(c, f).tolist(), f

    @pytest.mark.parametrize("field", ["ctf/df1_A", "ctf/df2_A", "ctf/df_angle_rad",
                                       "ctf/accel_kv", "ctf/cs_mm", "ctf/amp_contrast",
                                       "blob/psize_A"])
    def test_missing_field_is_named(self, tmp_path, field):
        path, _ = self.write(tmp_path, drop=(field,))
        with pytest.raises(ValueError, match=f"particles.cs: missing field {field}"):
            read_cs(path)
        if field == "blob/psize_A":
            assert read_cs(path, pixel_size=1.5)[0].pixel_size.tolist() == [1.5] * 4

    def test_optional_fields(self, tmp_path):
        path, _ = self.write(tmp_path, drop=("ctf/phase_shift_rad", "blob/idx"))
        c, table = read_cs(path)
        assert c.phase_shift.tolist() == [0.0] * 4 and "rlnImageName" not in table

    def test_bad_files(self, tmp_path):
        path, _ = self.write(tmp_path)
        with pytest.raises(ValueError, match="particles.cs: has 4 particle rows, expected 5"):
            read_cs(path, n_images=5)
        with pytest.raises(TypeError, match="n_images"):
            read_cs(path, n_images="4")
        plain = tmp_path / "plain.cs"
        with open(plain, "wb") as fh:
            np.save(fh, np.zeros((3, 2)))
        with pytest.raises(ValueError, match="plain.cs: expected a cryoSPARC .cs file"):
            read_cs(plain)
        (tmp_path / "text.cs").write_text("hello")
        with pytest.raises(ValueError, match="text.cs: cannot read it as a cryoSPARC"):
            read_cs(tmp_path / "text.cs")
        with pytest.raises(FileNotFoundError, match="missing.cs"):
            read_cs(tmp_path / "missing.cs")
        with pytest.raises(IsADirectoryError, match="a folder"):
            read_cs(tmp_path)


# ----------------------------------------------------------------------------- rotation centre
class TestRotationCentre:
    def test_centres(self):
        assert rotation_centre(64, 64) == (31.5, 31.5)
        assert rotation_centre(64, 48, "fourier") == (24.0, 32.0)
        assert rotation_centre(33, 33, "fourier") == (16.0, 16.0)
        assert centre_padding(64, 33, "fourier") == (1, 0)
        with pytest.raises(ValueError, match="rotation_center"):
            rotation_centre(8, 8, "centre")

    @pytest.mark.parametrize("L", [6, 16])
    def test_quarter_turn_about_half_L(self, L):
        img = np.random.default_rng(0).random((1, L, L)).astype(np.float32)
        out = warp_se2(img, [[90.0, 0.0, 0.0]], rotation_center="fourier")
        # about L/2 (0-based) a quarter turn counter-clockwise sends (x, y) to (y, L - x):
        # np.rot90 (which sends it to (y, L - 1 - x)) moved one row down
        expected = np.zeros_like(img)
        expected[0, 1:] = np.rot90(img[0])[:-1]
        np.testing.assert_allclose(out, expected, atol=1e-5)
        half = warp_se2(img, [[180.0, 0.0, 0.0]], rotation_center="fourier")
        expected = np.zeros_like(img)
        expected[0, 1:, 1:] = img[0, ::-1, ::-1][:-1, :-1]
        np.testing.assert_allclose(half, expected, atol=1e-5)
        mirror = warp_se2(img, [[0.0, 0.0, 0.0, 1.0]], rotation_center="fourier")
        expected = np.zeros_like(img)
        expected[0, :, 1:] = img[0, :, 1:][:, ::-1]  # x -> L - x
        np.testing.assert_allclose(mirror, expected, atol=1e-5)

    def test_geometric_is_unchanged_and_odd_sizes_agree(self):
        img = np.random.default_rng(1).random((2, 9, 9)).astype(np.float32)
        p = [[37.0, 0.5, -1.0], [-12.0, 0.0, 2.0]]
        np.testing.assert_array_equal(warp_se2(img, p), warp_se2(img, p,
                                                                 rotation_center="geometric"))
        np.testing.assert_allclose(warp_se2(img, p), warp_se2(img, p, rotation_center="fourier"),
                                   atol=1e-6)

    def test_class_averages_exact_about_the_fourier_centre(self):
        # quarter turns about L/2 of images with an empty border are exact: each one-step
        # average of the turned copies is the image itself, and the neighbours are exact
        L = 16
        views = [projection(L, seed=s, border=2).astype(np.float32) for s in range(2)]
        X = np.stack([warp_se2(v[None], [[90.0 * k, 0, 0]], rotation_center="fourier")[0]
                      for v in views for k in range(4)])
        avg = class_averages(X, n_neighbors=3, n_rotations=4, refine=False,
                             rotation_center="fourier", device="cpu")
        np.testing.assert_allclose(avg, X, atol=1e-5)
        geo = class_averages(X, n_neighbors=3, n_rotations=4, refine=False,
                             rotation_center="geometric", device="cpu")
        assert np.abs(geo - X).max() > 0.05 * np.abs(X).max()  # half a pixel off: blurred
        ind, tau = aligned_neighbors(X, n_neighbors=3, n_rotations=4, refine=False,
                                     rotation_center="fourier", device="cpu")
        assert (ind // 4 == np.arange(8)[:, None] // 4).all()
        np.testing.assert_allclose(warp_se2(X[ind[:, 0]], tau[:, 0], rotation_center="fourier"),
                                   X, atol=1e-5)


# ----------------------------------------------------------------------------- command line
class TestCommandLine:
    @pytest.fixture
    def stack(self, tmp_path):
        """12 particles of 16 x 16 (two views, each turned by quarter turns about pixel (8, 8),
        under their own CTF), as particles.mrcs and particles.star."""
        mrcfile = pytest.importorskip("mrcfile")
        L = 16
        views = [projection(L, seed=s, border=2) for s in range(2)]
        clean = np.stack([warp_se2(v[None], [[90.0 * k, 0, 0]], rotation_center="fourier")[0]
                          for v in views for k in range(4) for _ in range(1 if k else 3)])
        n = len(clean)
        rng = np.random.default_rng(0)
        du = rng.uniform(10000.0, 25000.0, n)
        ctf = CTF(du, du - 2000.0, rng.uniform(-90, 90, n), voltage=200,
                  spherical_aberration=2.0, pixel_size=5.0)
        y = apply_ctf(clean, ctf).astype(np.float32)
        with mrcfile.new(tmp_path / "particles.mrcs") as mrc:
            mrc.set_data(y)
            mrc.set_image_stack()
            mrc.voxel_size = 5.0
        optics, particles = star_tables(ctf)
        particles.insert(0, "rlnImageName", [f"{i + 1:06d}@particles.mrcs" for i in range(n)])
        write_star(tmp_path / "particles.star", particles, optics=optics)
        return tmp_path, clean, y, ctf

    def test_one_step(self, stack, capsys):
        from _cli import call

        tmp, clean, y, ctf = stack
        out = tmp / "o"
        proc = call(capsys, "class-averages", tmp / "particles.mrcs", "--star",
                    tmp / "particles.star", "--one-step", "--n-neighbors", 3, "--n-rotations",
                    4, "--no-refine", "--snr", 1e6, "--device", "cpu", "--out", out)
        assert proc.returncode == 0, proc.stderr
        import mrcfile

        with mrcfile.open(out / "class_averages.mrcs") as mrc:
            averages = np.array(mrc.data)
        ref = class_averages(y, n_neighbors=3, n_rotations=4, refine=False, ctf=ctf, snr=1e6,
                             device="cpu")
        np.testing.assert_allclose(averages, ref, atol=1e-5)
        table = starfile.read(out / "particles.star", always_dict=True)["particles"]
        assert list(table["rlnClassNumber"]) == list(range(1, len(y) + 1))
        assert list(table["rlnImageName"])[0] == "000001@particles.mrcs"

    def test_classes(self, stack, capsys):
        from _cli import call

        tmp, clean, y, ctf = stack
        out = tmp / "o"
        proc = call(capsys, "class-averages", tmp / "particles.mrcs", "--star",
                    tmp / "particles.star", "--n-clusters", 2, "--n-rotations", 4, "--no-refine",
                    "--snr", 1e6, "--device", "cpu", "--out", out)
        assert proc.returncode == 0, proc.stderr
        import mrcfile

        with mrcfile.open(out / "class_averages.mrcs") as mrc:
            averages = np.array(mrc.data)
        assert averages.shape == (2, 16, 16)
        blocks = starfile.read(out / "particles.star", always_dict=True)
        assert set(blocks) == {"optics", "particles"}
        table = blocks["particles"]
        assert len(table) == len(y) and set(table["rlnClassNumber"]) == {1, 2}
        # the particles of a view share a class, and each class average is its view's
        # projection (no CTF) in some quarter turn: not exactly, as the CTF spreads each
        # particle over its whole box and a quarter turn about (8, 8) moves a row out of it
        cls = table["rlnClassNumber"].to_numpy()
        assert len(set(cls[:6])) == 1 and len(set(cls[6:])) == 1
        for c in (1, 2):
            member = clean[np.flatnonzero(cls == c)[0]]
            err = min(np.abs(averages[c - 1] - warp_se2(member[None].astype(np.float32),
                                                         [[90.0 * k, 0, 0]],
                                                         rotation_center="fourier")[0]).max()
                      for k in range(4))
            assert err < 0.05 * np.abs(member).max()
        # RELION's transformation of each particle (relion_stack_create --apply_transformation)
        # puts it on its class average
        for i in range(len(y)):
            row = table.loc[i]
            aligned = relion_apply_transformation(
                clean[i], row["rlnAnglePsi"], row["rlnOriginXAngst"] / 5.0,
                row["rlnOriginYAngst"] / 5.0, row["rlnIsFlip"])
            ref = averages[cls[i] - 1]
            assert np.abs(aligned - ref).max() < 0.05 * np.abs(ref).max()

    def test_bad_star(self, stack, capsys):
        from _cli import assert_usage_error, call

        tmp, _, y, ctf = stack
        optics, particles = star_tables(ctf[:5])
        write_star(tmp / "short.star", particles, optics=optics)
        out = tmp / "o"
        assert_usage_error(call(capsys, "class-averages", tmp / "particles.mrcs", "--star",
                                tmp / "short.star", "--one-step", "--out", out),
                           f"--star {tmp / 'short.star'}: has 5 particle rows, expected 12")
        del optics["rlnVoltage"]
        write_star(tmp / "novolt.star", star_tables(ctf)[1], optics=optics)
        assert_usage_error(call(capsys, "class-averages", tmp / "particles.mrcs", "--star",
                                tmp / "novolt.star", "--one-step", "--out", out),
                           "missing column rlnVoltage")
        assert not (out / "class_averages.mrcs").exists()


    def test_star_naming_the_stack(self, stack, capsys):
        """Rows naming ``N@particles.mrc`` read a .mrc with a volume's header as a stack, and
        must name the images in the stack's order; a .cs file works as a STAR file does."""
        import mrcfile
        from _cli import assert_usage_error, call

        tmp, _, y, ctf = stack
        with mrcfile.new(tmp / "particles.mrc") as mrc:
            mrc.set_data(y)
            mrc.set_volume()
        optics, particles = star_tables(ctf)
        names = [f"{i + 1:06d}@Extract/job1/particles.mrc" for i in range(len(y))]
        particles.insert(0, "rlnImageName", names)
        write_star(tmp / "vol.star", particles, optics=optics)
        args = ("--one-step", "--n-neighbors", 3, "--n-rotations", 4, "--no-refine", "--snr",
                1e6, "--device", "cpu")
        ref = None
        for star in ("particles.star", "vol.star"):
            proc = call(capsys, "class-averages", tmp / "particles.mrcs", "--star", tmp / star,
                        *args, "--out", tmp / "ref")
            assert proc.returncode == 0, proc.stderr
        with mrcfile.open(tmp / "ref" / "class_averages.mrcs") as mrc:
            ref = np.array(mrc.data)
        proc = call(capsys, "class-averages", tmp / "particles.mrc", "--star", tmp / "vol.star",
                    *args, "--out", tmp / "vol")
        assert proc.returncode == 0, proc.stderr
        with mrcfile.open(tmp / "vol" / "class_averages.mrcs") as mrc:
            np.testing.assert_array_equal(np.array(mrc.data), ref)
        # a cryoSPARC .cs file of the same particles (blob/idx 0-based, blob/path)
        cs = np.zeros(len(y), [("blob/path", "S40"), ("blob/idx", "<u4"),
                               ("blob/psize_A", "<f8"), ("ctf/accel_kv", "<f8"),
                               ("ctf/cs_mm", "<f8"), ("ctf/amp_contrast", "<f8"),
                               ("ctf/df1_A", "<f8"), ("ctf/df2_A", "<f8"),
                               ("ctf/df_angle_rad", "<f8")])
        cs["blob/path"], cs["blob/idx"] = b"J2/particles.mrc", np.arange(len(y))
        for name, value in (("blob/psize_A", ctf.pixel_size), ("ctf/accel_kv", ctf.voltage),
                            ("ctf/cs_mm", ctf.spherical_aberration),
                            ("ctf/amp_contrast", ctf.amplitude_contrast),
                            ("ctf/df1_A", ctf.defocus_u), ("ctf/df2_A", ctf.defocus_v),
                            ("ctf/df_angle_rad", np.radians(ctf.defocus_angle))):
            cs[name] = value
        with open(tmp / "particles.cs", "wb") as fh:
            np.save(fh, cs)
        proc = call(capsys, "class-averages", tmp / "particles.mrc", "--star",
                    tmp / "particles.cs", *args, "--out", tmp / "cs")
        assert proc.returncode == 0, proc.stderr
        with mrcfile.open(tmp / "cs" / "class_averages.mrcs") as mrc:
            np.testing.assert_allclose(np.array(mrc.data), ref, atol=1e-5)
        table = starfile.read(tmp / "cs" / "particles.star", always_dict=True)["particles"]
        assert list(table["rlnImageName"])[:2] == ["000001@J2/particles.mrc",
                                                   "000002@J2/particles.mrc"]
        # rows out of the stack's order: refused, not a silent wrong CTF
        particles["rlnImageName"] = [names[1], names[0], *names[2:]]
        write_star(tmp / "swapped.star", particles, optics=optics)
        assert_usage_error(call(capsys, "class-averages", tmp / "particles.mrc", "--star",
                                tmp / "swapped.star", *args, "--out", tmp / "x"),
                           "swapped.star: row 1 names image 2 of particles.mrc, expected "
                           "image 1")
        # --pixel-size replaces the file's
        proc = call(capsys, "class-averages", tmp / "particles.mrc", "--star",
                    tmp / "particles.cs", "--pixel-size", 2.5, *args, "--out", tmp / "px")
        assert proc.returncode == 0, proc.stderr
        table = starfile.read(tmp / "px" / "particles.star", always_dict=True)["particles"]
        assert set(table["rlnImagePixelSize"]) == {2.5}
        assert_usage_error(call(capsys, "class-averages", tmp / "particles.mrc", "--star",
                                tmp / "particles.cs", "--pixel-size", 0, *args, "--out",
                                tmp / "x"), "--pixel-size")
        assert_usage_error(call(capsys, "class-averages", tmp / "particles.mrc", "--star",
                                tmp, *args, "--out", tmp / "x"), f"--star {tmp}: a folder")


def relion_apply_transformation(img, psi, xoff, yoff, flip=0):
    """An image transformed as RELION's ``relion_stack_create --apply_transformation`` does
    (float64): ``applyGeometry(img, A, IS_NOT_INV, DONT_WRAP)`` with ``A`` its
    ``rotation2DMatrix(psi)`` ``[[cos, -sin], [sin, cos]]`` and the translation ``(xoff,
    yoff)`` in pixels, coordinates ``(column, row)`` about the pixel ``(W // 2, H // 2)``:
    output pixel ``u`` takes the input at ``A^-1 u`` (bilinear, zero outside); a mirror
    ``x -> -x`` about that pixel first where ``flip`` is set."""
    from scipy.ndimage import map_coordinates

    img = np.asarray(img, dtype=np.float64)
    h, w = img.shape
    cy, cx = h // 2, w // 2
    if flip:
        cols = 2 * cx - np.arange(w)
        img = np.where((cols >= 0) & (cols < w), img[:, np.clip(cols, 0, w - 1)], 0.0)
    a = np.deg2rad(float(psi))
    A = np.array([[np.cos(a), -np.sin(a), xoff], [np.sin(a), np.cos(a), yoff], [0, 0, 1]])
    rows, cols = np.mgrid[0:h, 0:w]
    u = np.stack([cols.ravel() - cx, rows.ravel() - cy, np.ones(h * w)])
    xp, yp, _ = np.linalg.inv(A) @ u
    out = map_coordinates(img, [yp + cy, xp + cx], order=1, mode="constant", cval=0.0)
    return out.reshape(h, w)


def test_relion_apply_transformation_is_the_inverse_warp():
    """The reference helper above against this package's warp: RELION's (psi, origin) of a
    particle is this package's ``(-psi, origin)`` about the Fourier centre, and its mirror
    ``x -> -x`` about that pixel is this package's mirror, applied first."""
    rng = np.random.default_rng(0)
    img = np.zeros((16, 16))
    img[4:12, 5:11] = rng.random((8, 6))
    for psi, x, y, flip in [(30.0, 1.5, -0.5, 0), (-75.0, 0.0, 2.0, 1), (180.0, -1.0, 0.0, 1)]:
        ours = warp_se2(img[None].astype(np.float32), [[-psi, x, y, flip]],
                        rotation_center="fourier")[0]
        np.testing.assert_allclose(relion_apply_transformation(img, psi, x, y, flip), ours,
                                   atol=1e-5)


def test_results_table_is_relions_transformation():
    """``particles.star``'s columns: RELION's transformation of each particle, mirrored first,
    puts it on its class average (shifts, angles and mirrors that the class test's grid does
    not reach)."""
    import pandas as pd

    from invariant_cluster._cli_averages import results_table
    from invariant_cluster.transforms import invert_se2

    # two smooth blobs (bilinear warps there and back blur sharp content)
    yy, xx = np.mgrid[0:16, 0:16]
    avg = (np.exp(-((xx - 6) ** 2 + (yy - 7) ** 2) / 6.0)
           + 0.6 * np.exp(-((xx - 10) ** 2 + (yy - 9) ** 2) / 5.0)).astype(np.float32)
    tau = np.array([[25.0, 1.0, -0.5, 0], [-140.0, -1.5, 0.75, 1], [90.0, 0.0, 2.0, 1]])
    # each particle is the average moved by the inverse of its alignment onto the average
    particles = warp_se2(np.repeat(avg[None], len(tau), 0), invert_se2(tau),
                         rotation_center="fourier")
    table = results_table(pd.DataFrame({"rlnImageName": ["a", "b", "c"]}), np.zeros(3, int),
                          tau, pixel_size=2.0)
    for i in range(len(tau)):
        row = table.loc[i]
        aligned = relion_apply_transformation(
            particles[i], row["rlnAnglePsi"], row["rlnOriginXAngst"] / 2.0,
            row["rlnOriginYAngst"] / 2.0, row["rlnIsFlip"])
        # (the inverse convention, which the file had before, misses by 0.58-1.0)
        assert np.abs(aligned - avg).max() < 0.15
