"""
Does a trained ViT behave as kernel PCA?
========================================

The papers' Figures 1 and 2, small: trains :class:`invariant_cluster.attention.VisionTransformer`
(softmax attention) on the MNIST test split (fixed 8,000 / 2,000 split) on the CPU. Before
training and after every epoch, on fixed held-out batches, it captures each layer's Q, K, V and
logs the projection loss ``J_proj`` in both forms (``consistent`` and the released code's
``official``) with both terms (``||varphi(q)||^2`` and ``||h||^2``). Before and after training
it runs the eigenvector check ("Eq. 11") against its random-vector baseline. Prints tables,
writes ``kpca_diagnostics.json`` (its run ``default``, or ``quick``) and ``kpca_diagnostics.png``
into ``--out`` (``examples/reproductions/results/`` by default, whose tables the benchmarks page
shows).

Training takes longer than a build of this site, so the gallery shows this script without
running it. Run from the repository root::

    python examples/reproductions/kpca_diagnostics.py            # a few minutes on 2 cores
    python examples/reproductions/kpca_diagnostics.py --quick    # smoke run, under a minute

Data: ``--data`` (default: the environment variable INVARIANT_CLUSTER_DATA, else
``../shared/data`` relative to the repository root), holding ``mnist/t10k-*-ubyte.gz``.

This module also holds the small helpers (IDX reader, fixed split, training loop) that
``rpc_robustness.py`` imports.
"""

from __future__ import annotations

import argparse
import gzip
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script from a checkout without installing
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))  # the benchmarks' runner writes the JSON

from _common import write_json  # noqa: E402

from invariant_cluster.attention import VisionTransformer  # noqa: E402
from invariant_cluster.diagnostics import (  # noqa: E402
    capture_attention,
    eigenvector_check,
    projection_loss,
)

# Pixel normalisation applied inside the model wrapper, so that perturbations live in [0, 1].
PIXEL_MEAN, PIXEL_STD = 0.5, 0.3
SPLIT_SEED, N_TRAIN = 0, 8000
FILES = {"images": "t10k-images-idx3-ubyte.gz", "labels": "t10k-labels-idx1-ubyte.gz"}


# ----------------------------------------------------------------------------- shared helpers
def default_data_dir() -> Path:
    """``$INVARIANT_CLUSTER_DATA`` (its first entry, if a path list), else ``../shared/data``."""
    env = os.environ.get("INVARIANT_CLUSTER_DATA")
    return Path(env.split(os.pathsep)[0]) if env else (ROOT / ".." / "shared" / "data").resolve()


def read_idx(path: Path) -> np.ndarray:
    """A gzip'd IDX file as a NumPy array (big-endian header: magic, then one uint32 per dim)."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    if raw[:2] != b"\x00\x00" or raw[2] != 0x08:
        raise ValueError(f"{path}: not an unsigned-byte IDX file (magic {raw[:4].hex()})")
    ndim = raw[3]
    dims = np.frombuffer(raw[4 : 4 + 4 * ndim], dtype=">u4").astype(int)
    data = np.frombuffer(raw[4 + 4 * ndim :], dtype=np.uint8)
    if data.size != math.prod(dims):
        raise ValueError(f"{path}: header says {tuple(dims)} but holds {data.size} values")
    return data.reshape(dims)


def load_split(data_dir: Path, name: str):
    """The fixed 8,000 / 2,000 split of a test split: ``(X_train, y_train, X_test, y_test)``.

    Images are float32 in ``[0, 1]`` of shape ``(n, 1, 28, 28)``; labels int64. The permutation
    comes from ``numpy.random.RandomState(0)`` and is the same for every run and dataset.
    """
    folder = Path(data_dir) / name
    X = read_idx(folder / FILES["images"])
    y = read_idx(folder / FILES["labels"])
    perm = np.random.RandomState(SPLIT_SEED).permutation(len(X))
    X = torch.tensor(X[perm], dtype=torch.float32).unsqueeze(1) / 255.0
    y = torch.tensor(y[perm].astype(np.int64))
    return X[:N_TRAIN], y[:N_TRAIN], X[N_TRAIN:], y[N_TRAIN:]


def data_available(data_dir: Path, names=("mnist",)) -> bool:
    return all((Path(data_dir) / n / f).is_file() for n in names for f in FILES.values())


class Normalised(torch.nn.Module):
    """``model((x - mean) / std)``: the classifier seen from pixel space ``[0, 1]``."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model((x - PIXEL_MEAN) / PIXEL_STD)


def make_vit(attention: str, seed: int, **kwargs) -> Normalised:
    """The benchmarks' ViT: 28x28 images, 7x7 patches (17 tokens), width 64, 4 blocks, 4 heads."""
    cfg = dict(image_size=28, patch_size=7, dim=64, depth=4, num_heads=4, num_classes=10)
    cfg.update(kwargs)
    return Normalised(VisionTransformer(attention=attention, random_state=seed, **cfg))


class Trainer:
    """AdamW with a one-cycle learning rate; the batch order comes from a local generator."""

    def __init__(self, model, n_train, epochs, seed, batch_size=128, lr=4e-3, weight_decay=0.05):
        self.model = model
        self.batch_size = batch_size
        steps = epochs * math.ceil(n_train / batch_size)
        self.opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
        self.sched = torch.optim.lr_scheduler.OneCycleLR(
            self.opt, max_lr=lr, total_steps=steps, pct_start=0.1
        )
        self.gen = torch.Generator().manual_seed(seed)

    def epoch(self, X, y) -> float:
        self.model.train()
        perm = torch.randperm(len(X), generator=self.gen)
        total = 0.0
        for start in range(0, len(X), self.batch_size):
            idx = perm[start : start + self.batch_size]
            loss = torch.nn.functional.cross_entropy(self.model(X[idx]), y[idx])
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            self.opt.step()
            self.sched.step()
            total += loss.item() * len(idx)
        self.model.eval()
        return total / len(X)


@torch.no_grad()
def accuracy(model, X, y, batch_size=500) -> float:
    model.eval()
    correct = sum(
        int((model(X[i : i + batch_size]).argmax(1) == y[i : i + batch_size]).sum())
        for i in range(0, len(X), batch_size)
    )
    return correct / len(X)


def add_common_arguments(parser):
    parser.add_argument("--data", type=Path, default=None,
                        help="folder with mnist/ and fashion-mnist/ (default: "
                             "$INVARIANT_CLUSTER_DATA or ../shared/data)")
    parser.add_argument("--out", type=Path, default=ROOT / "examples" / "reproductions" / "results",
                        help="where the JSON and PNG go (default: examples/reproductions/results)")
    parser.add_argument("--quick", action="store_true", help="smoke run, under a minute")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (default 1: this ViT's matrices are small, and "
                             "on shared cores a second OpenMP thread often stalls)")
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG")


# ----------------------------------------------------------------------------- this benchmark
def _summary_stats(res):
    """Medians over images, heads and components of an eigenvector_check result."""
    med = {k: float(np.nanmedian(np.asarray(v))) for k, v in res.items()}
    med["ratio_to_random"] = med["abs_diff_mean"] / med["random_abs_diff_mean"]
    med["rel_ratio_to_random"] = med["rel_diff_mean"] / med["random_rel_diff_mean"]
    return med


def _capture(model, images):
    """capture_attention with the layers named ``layer 0``, ``layer 1``, ... (in call order)."""
    return {f"layer {i}": r for i, r in enumerate(capture_attention(model, images).values())}


def _eigen_checks(model, images, n_random, seed):
    out, raw = {}, {}
    for name, r in _capture(model, images).items():
        res = eigenvector_check(r["k"], r["v"], scale=r["scale"], n_random=n_random,
                                random_state=seed)
        raw[name] = res
        out[name] = _summary_stats(res)
    return out, raw


CLAIMS = [("official_loss_falls", "official J_proj (log mean) falls"),
          ("consistent_j_falls", "consistent J_proj falls"),
          ("fraction_negative_j_final", "fraction of queries with J_proj < 0"),
          ("h_over_phi_final_medians", "median ||h||^2 / ||varphi(q)||^2"),
          ("eigvec_ratio_trained", "eigenvector check / random baseline (trained)"),
          ("eigvec_rel_ratio_trained", "relative check / random baseline (trained)"),
          ("eigvec_far_below_random", "eigenvector check far below random")]


def table_rows(result):
    """The benchmarks page's table (rows of data, method, metric, value, machine, date): each
    claim per layer, under the trained ViT's test accuracy."""
    acc = result["history"].get("test_accuracy", [])
    data = (f"ViT test accuracy after {len(acc) - 1} epoch(s): {acc[-1]:.3f}." if acc
            else "small ViT on MNIST")
    machine = f"CPU, {result['config'].get('threads')} torch thread(s)"
    return [{"data": data, "method": label, "metric": layer, "value": claims[key],
             "machine": machine, "date": ""}
            for key, label in CLAIMS for layer, claims in result["claims"].items()
            if key in claims]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_arguments(parser)
    parser.add_argument("--epochs", type=int, default=None, help="default 15 (quick: 1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--n-diag", type=int, default=None,
                        help="held-out images for J_proj, in 2 fixed batches (default 128)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    data_dir = args.data if args.data is not None else default_data_dir()
    epochs = args.epochs if args.epochs is not None else (1 if args.quick else 15)
    n_diag = args.n_diag if args.n_diag is not None else (32 if args.quick else 128)
    n_eig = 8 if args.quick else 32
    t0 = time.perf_counter()

    Xtr, ytr, Xte, yte = load_split(data_dir, "mnist")
    if args.quick:
        Xtr, ytr, Xte, yte = Xtr[:1000], ytr[:1000], Xte[:500], yte[:500]
    diag = Xte[:n_diag]  # fixed held-out batches (two halves, concatenated for one capture)
    model = make_vit("softmax", args.seed)
    trainer = Trainer(model, len(Xtr), epochs, args.seed)

    history = {"epoch": [], "train_loss": [], "test_accuracy": []}
    per_layer = {}  # layer -> form -> list of projection_loss dicts (kept for the plot)

    def log(epoch, train_loss):
        model.eval()
        history["epoch"].append(epoch)
        history["train_loss"].append(train_loss)
        history["test_accuracy"].append(accuracy(model, Xte, yte))
        halves = (diag[: len(diag) // 2], diag[len(diag) // 2 :])
        caps = [_capture(model, h) for h in halves]
        for name in caps[0]:
            q, k, v = (np.concatenate([c[name][key] for c in caps]) for key in "qkv")
            for form in ("consistent", "official"):
                res = projection_loss(q, k, v, scale=caps[0][name]["scale"], form=form)
                per_layer.setdefault(name, {}).setdefault(form, []).append(res)

    eig_init, raw_init = _eigen_checks(model, Xte[:n_eig], 4 if args.quick else 10, args.seed)
    log(0, float("nan"))
    for epoch in range(1, epochs + 1):
        loss = trainer.epoch(Xtr, ytr)
        log(epoch, loss)
        last = {n: f["consistent"][-1]["mean_j_proj"] for n, f in per_layer.items()}
        print(f"epoch {epoch:2d}  loss {loss:.4f}  test acc {history['test_accuracy'][-1]:.4f}  "
              f"J_proj {' '.join(f'{v:.3g}' for v in last.values())}  "
              f"({time.perf_counter() - t0:.0f} s)", flush=True)
    eig_trained, raw_trained = _eigen_checks(model, Xte[:n_eig], 4 if args.quick else 10,
                                             args.seed)

    keys = ("phi_q_sq_norm", "h_sq_norm", "j_proj")
    projection = {
        name: {
            form: {
                **{f"mean_{k}": [r[f"mean_{k}"] for r in rs] for k in keys},
                **{f"median_{k}": [float(np.median(r[k])) for r in rs] for k in keys},
                "fraction_negative_j": [float(np.mean(r["j_proj"] < 0)) for r in rs],
                "loss": [r["loss"] for r in rs],
            }
            for form, rs in forms.items()
        }
        for name, forms in per_layer.items()
    }
    claims = _claims(projection, eig_init, eig_trained)
    result = {
        "benchmark": "kpca_diagnostics",
        "config": {
            "data": "MNIST test split, fixed 8000 / 2000 split (RandomState(0) permutation)",
            "n_train": len(Xtr), "n_test": len(Xte), "n_diag_images": len(diag),
            "n_eigen_images": n_eig, "epochs": epochs, "seed": args.seed, "quick": args.quick,
            "model": "VisionTransformer(28, patch 7, dim 64, depth 4, heads 4, softmax)",
            "optimiser": "AdamW lr 4e-3 one-cycle, weight decay 0.05, batch 128",
            "threads": args.threads,
        },
        "history": history,
        "projection_loss": projection,
        "eigenvector_check": {"init": eig_init, "trained": eig_trained},
        "claims": claims,
        "wall_s": time.perf_counter() - t0,
    }
    _print_tables(result)
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(result, args.out / "kpca_diagnostics.json", table_rows,
               run="quick" if args.quick else "default")
    if not args.no_plot:
        png = _plot(per_layer, history, raw_init, raw_trained, args.out / "kpca_diagnostics.png")
        print(f"wrote {png}")
    return result


def _rank_corr(a, b):
    """Spearman rank correlation over the entries where both are finite (None if < 3)."""
    from scipy.stats import spearmanr

    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    ok = np.isfinite(a) & np.isfinite(b)
    return float(spearmanr(a[ok], b[ok]).statistic) if ok.sum() >= 3 else None


def _claims(projection, eig_init, eig_trained):
    """What the run says about the papers' claims, from the numbers only.

    Trends are Spearman rank correlations with the epoch over the trained epochs (1..E, the
    random initialisation left out); "falls" means a correlation below -0.5. The eigenvector
    claim needs the learned values' median |gamma_i - gamma_j| below 0.1 x the random baseline.
    """
    out = {}
    for name, forms in projection.items():
        con, off = forms["consistent"], forms["official"]
        j, phi, h = (np.array(con[f"mean_{k}"]) for k in ("j_proj", "phi_q_sq_norm", "h_sq_norm"))
        epochs = np.arange(len(j))[1:]
        trend = _rank_corr(epochs, j[1:])
        med_trend = _rank_corr(epochs, con["median_j_proj"][1:])
        off_trend = _rank_corr(epochs, off["loss"][1:])
        out[name] = {
            # Figure 1: J_proj falls during training.
            "consistent_mean_j_trend": trend,
            "consistent_median_j_trend": med_trend,
            "official_loss_trend": off_trend,
            "consistent_j_falls": None if trend is None else trend < -0.5,
            "official_loss_falls": None if off_trend is None else off_trend < -0.5,
            # A projection residual is >= 0; learned values need not give one.
            "fraction_negative_j_final": con["fraction_negative_j"][-1],
            # Saritas & Yildiz: the terms are far apart, so J mostly tracks ||h||^2.
            "h_over_phi_final_means": float(h[-1] / phi[-1]),
            "h_over_phi_final_medians": float(
                con["median_h_sq_norm"][-1] / con["median_phi_q_sq_norm"][-1]),
            "rank_corr_j_with_minus_h": _rank_corr(j[1:], -h[1:]),
            "rank_corr_j_with_phi": _rank_corr(j[1:], phi[1:]),
            # Figure 2: after training the values are eigenvectors of the Gram matrix.
            "eigvec_ratio_init": eig_init[name]["ratio_to_random"],
            "eigvec_ratio_trained": eig_trained[name]["ratio_to_random"],
            "eigvec_rel_ratio_trained": eig_trained[name]["rel_ratio_to_random"],
            "eigvec_far_below_random": bool(eig_trained[name]["ratio_to_random"] < 0.1),
            "eigvec_improved_by_training": bool(
                eig_trained[name]["ratio_to_random"] < eig_init[name]["ratio_to_random"]
            ),
        }
    return out


def _print_projection_table(proj, epochs, columns):
    """Rows: each layer at epochs 0, 1, middle, last; ``columns``: (header, form, key, fmt)."""
    print(f"{'layer':<9}{'epoch':>6}" + "".join(f"{c[0]:>12}" for c in columns))
    for name, forms in proj.items():
        for i in sorted({0, 1, len(epochs) // 2, len(epochs) - 1}):
            print(f"{name:<9}{epochs[i]:>6}" + "".join(
                f"{forms[form][key][i]:>12{fmt}}" for _, form, key, fmt in columns))


def _print_tables(result):
    proj = result["projection_loss"]
    epochs = result["history"]["epoch"]
    terms = [("J {}", "j_proj"), ("phi {}", "phi_q_sq_norm"), ("h^2 {}", "h_sq_norm")]
    for stat, note in (("mean", "mean over 2 fixed held-out batches, all heads"),
                       ("median", "median over the same queries: the means are dominated by a "
                                  "few queries")):
        print(f"\nProjection loss per layer ({note})")
        columns = [(h.format(form[:3]), form, f"{stat}_{key}", ".4g")
                   for form in ("consistent", "official") for h, key in terms]
        if stat == "mean":
            columns.append(("log J off", "official", "loss", ".4g"))
        else:
            columns.append(("J<0 cons", "consistent", "fraction_negative_j", ".2f"))
        _print_projection_table(proj, epochs, columns)
    print("\nEigenvector check (medians over images, heads and components)")
    print(f"{'layer':<9}{'when':>8}{'|dgamma|':>12}{'random':>12}{'ratio':>9}"
          f"{'rel':>9}{'rel rand':>9}{'N lambda':>12}")
    for when in ("init", "trained"):
        for name, s in result["eigenvector_check"][when].items():
            print(f"{name:<9}{when:>8}{s['abs_diff_mean']:>12.4g}"
                  f"{s['random_abs_diff_mean']:>12.4g}{s['ratio_to_random']:>9.3g}"
                  f"{s['rel_diff_mean']:>9.3g}{s['random_rel_diff_mean']:>9.3g}"
                  f"{s['eigenvalue']:>12.4g}")
    h = result["history"]
    print(f"\nfinal test accuracy {h['test_accuracy'][-1]:.4f} after {epochs[-1]} epochs; "
          f"wall {result['wall_s']:.0f} s")
    print("\nClaims (trends: Spearman with the epoch over epochs 1..E; see _claims)")
    claims = result["claims"]
    print(f"{'':<30}" + "".join(f"{name:>12}" for name in claims))
    for key in next(iter(claims.values())):
        vals = [c[key] for c in claims.values()]
        print(f"{key:<30}" + "".join(
            f"{v:>12.3g}" if isinstance(v, float) else f"{v!s:>12}" for v in vals))


def _plot(per_layer, history, raw_init, raw_trained, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from invariant_cluster.plotting import plot_eigenvector_check, plot_projection_loss

    names = list(per_layer)
    fig, axes = plt.subplots(4, len(names), figsize=(4.2 * len(names), 13), squeeze=False)
    for col, name in enumerate(names):
        for row, form in enumerate(("consistent", "official")):
            plot_projection_loss(per_layer[name][form], ax=axes[row, col], x=history["epoch"],
                                 title=f"{name}: J_proj ({form})")
            axes[row, col].set_xlabel("epoch")
        plot_eigenvector_check(raw_init[name], ax=axes[2, col],
                               title=f"{name}: eigenvector check, init")
        plot_eigenvector_check(raw_trained[name], ax=axes[3, col],
                               title=f"{name}: eigenvector check, trained")
    fig.suptitle(f"ViT on MNIST (8000 train): kernel-PCA diagnostics; final test accuracy "
                 f"{history['test_accuracy'][-1]:.3f}")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


if __name__ == "__main__":
    main()
