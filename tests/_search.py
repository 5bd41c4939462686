"""Checks shared by the search tests: recall, the shortlist's contract, a call counter."""

import torch


def recall(true_idx, found_idx):
    """Share of each row of ``true_idx`` found anywhere in the same row of ``found_idx``."""
    return float((found_idx[:, :, None] == true_idx[:, None, :]).any(1).double().mean())


def assert_shortlist_contract(cand, n, m, own):
    """``cand`` is an ``(n, m)`` long shortlist of distinct keys without the excluded one."""
    assert cand.shape == (n, m) and cand.dtype == torch.long
    srt = cand.sort(1).values
    assert not bool((srt[:, 1:] == srt[:, :-1]).any()), "a key listed twice"
    assert not bool((cand == own[:, None]).any()), "the excluded key was listed"


def count_calls(monkeypatch, module, name):
    """Replace ``module.name`` by a wrapper that records each call; returns the record."""
    calls = []
    real = getattr(module, name)

    def spy(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, spy)
    return calls
