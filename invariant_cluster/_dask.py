"""Run independent block computations locally or on a dask.distributed cluster.

The expensive steps of invariant clustering (the alignment search of a block of queries against
the keys, the attention update of a block of queries) are independent across query blocks. This
module maps a function over such blocks, either in this process (the default) or on a dask
cluster, with the SAME function applied to the SAME blocks, so that both give bit-for-bit the
same result: the cluster only changes where each block runs, never how it is computed.

A cluster is used when

- a :class:`dask.distributed.Client` is passed as ``client=``, or
- joblib's dask backend is active (``with joblib.parallel_config(backend="dask"): ...``,
  the pattern scikit-learn documents for distributing its own estimators); its client is used.

Pointing the computation at a real cluster::

    from dask.distributed import Client
    client = Client("tcp://scheduler:8786")         # the scheduler's address
    neighbor_search(X, X, grid, k=32, client=client)

    # or, for code that only takes joblib settings (e.g. inside a scikit-learn estimator):
    import joblib
    with joblib.parallel_config(backend="dask"):   # uses the default Client created above
        ...

Every worker needs ``invariant_cluster`` and its dependencies (torch, kornia) importable, as for
any dask task. The shared inputs (the keys, their warps) are scattered to every worker ONCE
(``broadcast=True``) and each block is one task; the results are gathered in block order. Torch
uses its own intra-op threads inside each task: with several worker processes per machine set
``OMP_NUM_THREADS`` (or ``torch.set_num_threads`` in a worker plugin) so they do not oversubscribe
the cores.

An estimator's ``client`` parameter (:class:`DaskClientMixin`) is a connection, not a value:
:func:`sklearn.base.clone` (and so ``GridSearchCV``, ``cross_validate``) gives the clone the
same client, and a pickled estimator leaves it out (it unpickles with ``client=None``, computing
in its own process until ``set_params(client=...)``), as a client cannot be copied or pickled.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Sequence

__all__ = ["DaskClientMixin", "blocked_map", "resolve_client"]

# the states of a dask.distributed.Client that can no longer run tasks
_CLOSED = ("closing", "closed")


def _joblib_dask_client():
    """The client of joblib's dask backend when that backend is active, else None."""
    try:
        from joblib.parallel import get_active_backend
    except ImportError:  # pragma: no cover - joblib is a scikit-learn dependency
        return None
    try:
        backend, _ = get_active_backend()
    except Exception:  # pragma: no cover - defensive: joblib internals
        return None
    # Maintenance note: the class lives in joblib._dask; matching on its name avoids importing
    # dask when the user never asked for it.
    if type(backend).__name__ == "DaskDistributedBackend":
        return getattr(backend, "client", None)
    return None


def resolve_client(client=None):
    """The dask client to use: ``client`` itself, else joblib's dask backend's, else None.

    Parameters
    ----------
    client : dask.distributed.Client or None

    Returns
    -------
    client or None
        None means "compute in this process".

    Raises
    ------
    TypeError
        If ``client`` is not None and has no ``submit``/``scatter``/``gather`` methods.
    ValueError
        If the client (given, or joblib's dask backend's) is closed.
    """
    if client is None:
        client = _joblib_dask_client()
        if client is not None and getattr(client, "status", None) in _CLOSED:
            raise ValueError("joblib's dask backend: its Dask client is closed; open a new "
                             "dask.distributed.Client for the backend")
        return client
    if not all(callable(getattr(client, m, None)) for m in ("submit", "scatter", "gather")):
        raise TypeError(
            f"client: expected a dask.distributed.Client or None, got {type(client).__name__}"
        )
    if getattr(client, "status", None) in _CLOSED:
        raise ValueError(f"client: the Dask client is closed (status {client.status!r}); pass "
                         "a running dask.distributed.Client, or client=None to compute in "
                         "this process")
    return client


class DaskClientMixin:
    """The ``client`` parameter of an estimator: checked before the work, shared by clones,
    left out of pickles.

    A :class:`dask.distributed.Client` holds a live connection, which ``copy.deepcopy`` and
    ``pickle`` refuse; :func:`sklearn.base.clone` deep-copies every parameter that is not an
    estimator. So the clone gets the very client of the original (a connection is shared, not
    copied), and the pickled state has ``client=None``: an unpickled estimator computes in its
    own process until ``set_params(client=...)``. Put this class before the mixin that defines
    ``_validate`` and before :class:`~sklearn.base.BaseEstimator` among the bases.
    """

    def _validate(self, X, reset):
        if self.client is not None:  # a wrong or closed client, said before the long part
            resolve_client(self.client)
        return super()._validate(X, reset)

    def __sklearn_clone__(self):
        client = self.client
        if client is None:
            return super().__sklearn_clone__()
        twin = copy.copy(self)  # shallow: the same parameters and arrays, no copy of any
        twin.client = None
        new = super(DaskClientMixin, twin).__sklearn_clone__()
        return new.set_params(client=client)

    def __getstate__(self):
        state = super().__getstate__()
        if state.get("client") is None:
            return state
        return {**state, "client": None}  # a new dict: the estimator keeps its client


def blocked_map(fn: Callable, blocks: Iterable, *, shared: Sequence = (), client=None,
                desc=None, each: Callable | None = None, n_blocks=None):
    """``[fn(block, *shared) for block in blocks]``, locally or as one dask task per block.

    Parameters
    ----------
    fn : callable
        ``fn(block, *shared) -> result``; a module-level function (it is pickled to the workers).
    blocks : iterable
        The per-task inputs (e.g. a query block and its candidate keys). They travel with their
        task.
    shared : sequence
        Inputs every task needs (e.g. the warped keys): scattered to all workers once.
    client : dask.distributed.Client or None
        None: joblib's dask backend's client if that backend is active, else this process.
    desc : str, optional
        Label of the progress bar over the blocks (shown with an estimator's ``verbose=1``).
    each : callable, optional
        ``each(block, result)``, called in the order of ``blocks`` as the results come, instead
        of collecting them: in this process ``blocks`` may then be a generator, and only one
        block and its result are alive at a time (the memory of a search does not grow with
        its number of blocks).
    n_blocks : int, optional
        The number of blocks, for the progress bar when ``blocks`` is a generator.

    Returns
    -------
    results : list or None
        In the order of ``blocks``; identical to the local computation (same function on the
        same inputs). None with ``each``.
    """
    from ._heap import reusing_heap
    from ._progress import progress_bar

    client = resolve_client(client)
    if client is not None or each is None:
        blocks = list(blocks)
        n_blocks = len(blocks)
    with progress_bar(n_blocks, desc or getattr(fn, "__name__", "blocks")) as bar:
        if client is None:
            out = None if each is not None else []
            for b in blocks:
                r = fn(b, *shared)
                if each is None:
                    out.append(r)
                else:
                    each(b, r)
                del r
                bar.update()
            return out
        if not blocks:
            return None if each is not None else []
        # one scatter per shared object; wrapping in a list keeps dask from splitting a sequence.
        # hash=False: a key of its own for each call. dask's default key is the data's hash, so
        # a second call with the same data (a second fit, the next test) reused the key that the
        # first call's release was still forgetting on the scheduler, and its tasks were
        # cancelled for "lost dependencies"
        futures_shared = [client.scatter([s], broadcast=True, hash=False)[0] for s in shared]
        # the workers keep freed blocks in their heaps too (see invariant_cluster._heap)
        task = reusing_heap(fn)
        futures = [client.submit(task, b, *futures_shared, pure=False) for b in blocks]
        for f in futures:
            f.add_done_callback(lambda _: bar.update())
        try:
            if each is None:
                return client.gather(futures)
            for b, f in zip(blocks, futures):
                each(b, f.result())
            return None
        finally:
            for f in (*futures, *futures_shared):
                f.release()
