"""Shared helpers of the benchmarks: data, metrics, environment, JSON output."""

from __future__ import annotations

import json
import os
import platform
import resource
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = ROOT.parent / "shared" / "data"
RESULTS = Path(__file__).resolve().parent / "results"


def data_home(path=None) -> Path:
    """``--data`` argument, else ``$INVARIANT_CLUSTER_DATA``, else ``../shared/data``."""
    if path:
        return Path(path)
    env = os.environ.get("INVARIANT_CLUSTER_DATA")
    return Path(env.split(os.pathsep)[0]) if env else DEFAULT_DATA


def load_mnist_test(path=None, dataset="mnist"):
    from invariant_cluster.datasets import load_fashion_mnist, load_mnist

    loader = load_mnist if dataset == "mnist" else load_fashion_mnist
    b = loader(split="test", data_home=str(data_home(path)))
    return b.images.astype(np.float32), b.target.astype(np.int64)


def scores(y, labels) -> dict:
    from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

    from invariant_cluster.metrics import clustering_accuracy

    return {
        "acc": float(clustering_accuracy(y, labels)),
        "ari": float(adjusted_rand_score(y, labels)),
        "nmi": float(normalized_mutual_info_score(y, labels)),
    }


def environment() -> dict:
    import torch

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "machine": platform.machine(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "date": time.strftime("%Y-%m-%d"),
    }


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far (MB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def write_json(obj, path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2) + "\n")
    print(f"wrote {path}")


def print_table(rows, columns):
    widths = [max(len(c), *(len(_fmt(r.get(c))) for r in rows)) for c in columns]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths)))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print("  ".join(_fmt(r.get(c)).ljust(w) for c, w in zip(columns, widths)))


def _fmt(v):
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) >= 1000 or abs(v) < 0.01 else f"{v:.3f}"
    return str(v)
