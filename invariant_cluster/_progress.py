"""Progress bars over the long loops of a fit, switched on by the estimator's ``verbose``.

An estimator wraps its work in ``with progress(self.verbose):``; the loops inside (the blocks of
a search, the rows of the attention iteration still moving, the grouping, the centres) ask for
:func:`progress_bar`, which is a tqdm bar on standard error when ``verbose >= 1`` and a silent
stand-in with the same methods otherwise. The switch is a context variable, so the search
functions need no ``verbose`` argument of their own and the default stays silent. A bar asked
for while another is open (e.g. the small searches inside the loop over cluster centres) is
silent: one bar per stage. The command line's bar over its stages is :class:`StageBar`.
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
import threading

__all__ = ["progress", "progress_bar", "StageBar"]

_VERBOSE = contextvars.ContextVar("invariant_cluster_verbose", default=0)
_OPEN = contextvars.ContextVar("invariant_cluster_open_bar", default=False)


@contextlib.contextmanager
def progress(verbose):
    """Show progress bars (``verbose >= 1``) or not, within the block."""
    token = _VERBOSE.set(int(verbose or 0))
    try:
        yield
    finally:
        _VERBOSE.reset(token)


class _Silent:
    """What :func:`progress_bar` returns when progress is off."""

    def update(self, n=1):
        pass

    def set_postfix_str(self, s="", refresh=True):
        pass

    def close(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _Bar:
    """A tqdm bar that marks itself open, so that bars asked for inside it stay silent."""

    def __init__(self, **kwargs):
        from tqdm import tqdm

        self._bar = tqdm(**kwargs)
        self._token = _OPEN.set(True)

    def update(self, n=1):
        self._bar.update(n)

    def set_postfix_str(self, s="", refresh=True):
        self._bar.set_postfix_str(s, refresh=refresh)

    def close(self):
        if self._token is not None:
            self._bar.close()
            try:
                _OPEN.reset(self._token)
            except ValueError:  # closed in another context than it was opened in
                _OPEN.set(False)
            self._token = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def progress_bar(total=None, desc="", unit="block"):
    """A tqdm bar when progress is on (see :func:`progress`) and no other bar is open, else a
    silent stand-in with the same methods."""
    if _VERBOSE.get() < 1 or _OPEN.get():
        return _Silent()
    return _Bar(total=total, desc=desc, unit=unit, file=sys.stderr, leave=True,
                dynamic_ncols=True)


class StageBar:
    """The command line's bar over a few named stages; the elapsed time ticks while a stage
    runs.

    A stage (e.g. the whole fit) is one step; a background thread refreshes the bar every half
    second so the elapsed time stays live. Shown only on a terminal (tqdm's ``disable=None``)
    and never when ``quiet``. It does not count as an open bar: the estimator's own bars
    (:func:`progress_bar`) still show under it.
    """

    def __init__(self, stages, quiet):
        from tqdm.auto import tqdm

        self.bar = tqdm(total=len(stages), disable=True if quiet else None, unit="stage",
                        file=sys.stderr, leave=False,
                        bar_format="{desc} {bar} {n_fmt}/{total_fmt} [{elapsed}]")

    @contextlib.contextmanager
    def stage(self, name):
        self.bar.set_description_str(name)
        stop = threading.Event()

        def tick():
            while not stop.wait(0.5):
                self.bar.refresh()

        thread = None
        if not self.bar.disable:
            thread = threading.Thread(target=tick, daemon=True)
            thread.start()
        try:
            yield
        finally:
            stop.set()
            if thread is not None:
                thread.join()
        self.bar.update(1)

    def close(self):
        self.bar.close()
