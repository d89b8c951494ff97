"""The lifecycle every stream front end shares (:class:`StreamBase`): a ``with`` block that
closes on a clean exit and abandons on an error, a ``close`` that finishes once (its report
kept), and an abandon that stops every inner stream left open, its sealed frames kept for
``resume=True``.

A front end made of inner streams (``pyramid/streams.py``'s levels, ``xarray/streams.py``'s
variables, ``xarray/geo_streams.py``'s level groups) names them in :meth:`StreamBase._parts`
and closes them in order; ``write/streams.py``'s :class:`~shardwise.write.streams.Stream`,
the one stream they are all made of, finishes its own write.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType
from typing import Any, Self

from ..engine.report import WriteReport

__all__ = ["StreamBase"]


class StreamBase:
    """A stream front end's ``close``, context manager and abandon (module docstring).

    Subclasses name their inner streams (:meth:`_parts`) or finish themselves (:meth:`_finish`,
    :meth:`_abandon`); ``closed`` is set when the stream is closed or abandoned, ``report`` once
    it closed."""

    report: WriteReport | None = None
    closed: bool = False

    def close(self) -> WriteReport:
        """Flush and finish the stream once (the inner streams closed in order: a pyramid's
        levels and a GeoZarr stream's level groups level 0 first, a Dataset stream's
        variables); an error abandons it (the sealed frames kept for ``resume=True``) and is
        raised.

        Returns
        -------
        WriteReport
            What the stream wrote (also kept as ``report``).
        """
        if self.report is not None:
            return self.report
        try:
            report = self._finish()
        except BaseException as e:
            self._abandon(e)
            raise
        self.closed = True
        self.report = report
        return report

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if error is None:
            self.close()
        elif not self.closed:
            self._abandon(error)

    def _parts(self) -> Sequence[Any]:
        """The inner streams, in the order they close (each a :class:`StreamBase`)."""
        return ()

    def _finish(self) -> WriteReport:
        """Close every inner stream in order (:meth:`_closing` before and after each): their
        reports summed."""
        report: WriteReport | None = None
        for k, s in enumerate(self._parts()):
            self._closing(k, True)
            got = s.close()
            report = got if report is None else report + got
            self._closing(k, False)
        assert report is not None
        return report

    def _closing(self, k: int, before: bool) -> None:
        """Called before (``before``) and after the ``k``-th inner stream closes."""

    def _abandon(self, error: BaseException) -> None:
        """Stop after ``error``: every inner stream still open abandoned in order."""
        self.closed = True
        for s in self._parts():
            if not s.closed:
                s.__exit__(type(error), error, error.__traceback__)
