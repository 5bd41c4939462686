"""
RPC-Attention under noise
=========================

RPC-Attention replaces softmax attention by a few iterations of **Principal Attention Pursuit**
(PAP, :func:`~invariant_cluster.attention.principal_attention_pursuit`), which splits the keys
into a low-rank part and a sparse part and attends with the low-rank part. The claim is that a
model built with it (:class:`~invariant_cluster.attention.RPCAttention`) is more robust to
corrupted inputs. Two views:

1. PAP on synthetic low-rank keys with sparse gross corruption, against softmax attention:
   how far does each output move from the clean softmax output as more entries are corrupted?
2. The committed results of ``examples/reproductions/rpc_robustness.py`` (small ViTs trained
   on MNIST and Fashion-MNIST, several seeds, Gaussian noise and FGSM / PGD attacks), plotted
   from ``examples/reproductions/results/rpc_robustness.json``. Training those models takes far
   longer than a documentation build, so this page reads the file the reproduction wrote.
"""

# %%
# PAP on corrupted low-rank keys
# ------------------------------
# Keys of rank 4 (N = 64 tokens, width 32), the values are the clean keys. A share of the key
# entries receives a gross error (10 times a standard normal). The error is relative to the
# output of softmax attention on the clean keys.
import json
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import torch

from invariant_cluster.attention import principal_attention_pursuit

gen = torch.Generator().manual_seed(0)
N, C, RANK = 64, 32, 4
clean = (torch.randn(N, RANK, generator=gen, dtype=torch.float64)
         @ torch.randn(RANK, C, generator=gen, dtype=torch.float64)) / RANK ** 0.5
values = clean.clone()
errors = torch.randn(N, C, generator=gen, dtype=torch.float64) * 10
draw = torch.rand(N, C, generator=gen, dtype=torch.float64)


def softmax_attention(keys):
    return torch.softmax(keys @ keys.T / C ** 0.5, dim=-1) @ values


reference = softmax_attention(clean)
shares = [0.0, 0.01, 0.02, 0.05, 0.1, 0.2]
methods = {"softmax attention": softmax_attention}
for n_iter in (1, 2, 4):
    methods[f"PAP, {n_iter} iteration(s)"] = (
        lambda keys, n_iter=n_iter: principal_attention_pursuit(keys, values, n_iter=n_iter,
                                                                lam=4.0))
curves = {name: [] for name in methods}
for share in shares:
    corrupted = clean + (draw < share) * errors
    for name, attend in methods.items():
        out = attend(corrupted)
        curves[name].append(float((out - reference).norm() / reference.norm()))

print(f"{'corrupted share':<26}" + "".join(f"{s:>8.2f}" for s in shares))
for name, curve in curves.items():
    print(f"{name:<26}" + "".join(f"{e:>8.3f}" for e in curve))

fig, ax = plt.subplots(figsize=(6, 3.6), layout="constrained")
for name, curve in curves.items():
    ax.plot(shares, curve, "o-", label=name)
ax.set(xlabel="share of key entries corrupted", ylabel="relative error vs clean softmax",
       title="attention output under sparse gross corruption")
ax.legend()
plt.show()

# %%
# With no corruption, PAP is not softmax attention (it clips the keys and, after the first
# iteration, attends with its own output), so its curve does not start at zero. Whether it ends
# below softmax attention depends on the number of iterations and the corruption: read the table,
# do not assume.
#
# Trained models (the committed benchmark)
# ----------------------------------------
# SymViT (symmetric attention in every block) against RPC-SymViT (PAP in the first block), same
# seeds, accuracy on held-out images: clean, with Gaussian noise, and under FGSM and PGD attacks.
# The file is written by ``python examples/reproductions/rpc_robustness.py``; its configuration
# is printed below with the plot.
results = Path("reproductions", "results", "rpc_robustness.json")
if results.exists():
    bench = json.loads(results.read_text())["runs"]["default"]
    print({k: bench["config"][k] for k in ("model", "epochs", "n_train", "seeds")})
    fig, axes = plt.subplots(1, len(bench["summary"]), figsize=(11, 4), layout="constrained",
                             sharey=True, squeeze=False)
    for ax, (dataset, conditions) in zip(axes[0], bench["summary"].items()):
        names = list(conditions)
        x = np.arange(len(names))
        for offset, model in ((-0.2, "SymViT"), (0.2, "RPC-SymViT")):
            ax.bar(x + offset, [conditions[c][f"{model}_mean"] for c in names], width=0.4,
                   yerr=[conditions[c][f"{model}_std"] for c in names], label=model)
        ax.set_xticks(x, names, rotation=60, ha="right", fontsize=8)
        ax.set(title=dataset, ylabel="accuracy (mean +- std over seeds)", ylim=(0, 1))
    axes[0, 0].legend()
    plt.show()
else:
    print("no committed results: run python examples/reproductions/rpc_robustness.py")
