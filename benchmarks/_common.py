"""The benchmarks' shared runner: data, metrics, the machine record, the JSON and its table.

Every benchmark writes its result with :func:`write_json` into one file,
``results/<benchmark>.json``, as a run of its ``"runs"`` mapping (one per suite, keyed by a
short name; ``"default"`` for the script's defaults): the records it measured, the machine
(``env``), and ``"table"``, the rows that ``make_tables.py`` turns into the README's
and the documentation's tables, one schema for all (data, method, metric, value, machine,
date); it then prints a one-line summary.
"""

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


def machine(env: dict) -> str:
    """Where the numbers were measured, in the tables' words: the GPU, else the CPU cores."""
    cores = f"{env['cpu_count']} CPU cores" if env.get("cpu_count") else None
    if env.get("cuda"):
        return ", ".join(x for x in (env["cuda"], cores) if x)
    return cores or "CPU"


def table(result: dict, records, data, method, metrics: dict) -> list[dict]:
    """The table's rows of ``records``: ``data(record)`` and ``method(record)`` name the row,
    ``metrics`` maps each column's name to a record's key or to a function of the record;
    missing values are left out."""
    env = result.get("env") or result.get("environment") or {}
    out = []
    for rec in records:
        for name, get in metrics.items():
            value = get(rec) if callable(get) else rec.get(get)
            if value is not None:
                out.append({"data": data(rec), "method": method(rec), "metric": name,
                            "value": value, "machine": machine(env),
                            "date": env.get("date", "")})
    return out


def read_runs(path: Path) -> dict:
    """The runs of the result file ``path`` (``{}`` when it does not exist yet)."""
    path = Path(path)
    if not path.exists():
        return {}
    doc = json.loads(path.read_text())
    if not (isinstance(doc, dict) and isinstance(doc.get("runs"), dict)):
        raise ValueError(f"{path}: expected a result file with a 'runs' mapping, got "
                         f"{type(doc).__name__} without one")
    return doc["runs"]


def write_json(obj, path: Path, table_rows=None, run: str = "default"):
    """Write the result as the run ``run`` of the file ``path``, with its table
    (``table_rows(obj)``, else rows derived from its records by ``make_tables.derived_rows``),
    and print a one-line summary.

    A file holds one benchmark: ``{"benchmark": NAME, "runs": {RUN: result}}``; the other runs
    in it are kept as they are, so that a suite's rerun updates only its own run.
    """
    from make_tables import derived_rows

    if not isinstance(run, str) or not run:
        raise ValueError(f"run: expected a non-empty string, got {run!r}")
    obj = {k: v for k, v in obj.items() if k != "table"}
    obj["table"] = table_rows(obj) if table_rows is not None else derived_rows(obj)
    path = Path(path)
    runs = read_runs(path)
    runs[run] = obj
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"benchmark": path.stem, "runs": runs}, indent=2) + "\n")
    env = obj.get("env") or obj.get("environment") or {}
    print(f"{obj.get('benchmark', path.stem)}: {len(obj['table'])} figures "
          f"({len({r['data'] for r in obj['table']})} tables) on {machine(env)}, "
          f"{env.get('date', 'undated')}: wrote run {run!r} of {path}")
    return obj


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
