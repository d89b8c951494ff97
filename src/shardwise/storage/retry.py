"""One retry policy for every repeated store request: how many tries, the backoff between them
(doubling, capped, with jitter so that writers who failed together do not retry together), and
which failures are worth another try.

>>> RetryPolicy(backoff=0.1, jitter=0.0).wait(2)
0.4
>>> not_missing(FileNotFoundError()), transient(ConnectionResetError()), transient(ValueError())
(False, True, False)
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass


def transient(e: BaseException) -> bool:
    """A store failure worth another try: a dropped connection, a timeout, or obstore's generic
    error (a response body cut short, which obstore itself does not retry)."""
    if isinstance(e, ConnectionError | TimeoutError):
        return True
    try:
        from obstore.exceptions import GenericError
    except ImportError:  # pragma: no cover - obstore is optional
        return False
    return isinstance(e, GenericError)


def not_missing(e: BaseException) -> bool:
    """Any failure but "not found" (an answer, not a failure): a ``FileNotFoundError``, or an
    icechunk store's ``NotFoundError`` (a key it does not hold) or ``InvalidInputError`` (a
    listing under a name that is no group or array), which no repeat answers otherwise."""
    import sys

    if isinstance(e, FileNotFoundError):
        return False
    ic = sys.modules.get("icechunk")
    if ic is None:
        return True
    if isinstance(e, ic.InvalidInputError):  # only a listing under no group or array
        return getattr(e, "kind", None) != "bad-key-prefix"
    return not isinstance(e, ic.NotFoundError)


def any_error(e: BaseException) -> bool:
    """Every failure: for requests whose outcome the caller checks afterwards anyway."""
    return True


@dataclass(frozen=True)
class RetryPolicy:
    """``tries`` attempts; before attempt ``a + 1`` a wait of at most
    ``min(backoff_max, backoff * 2**a)`` seconds, shortened at random by up to the fraction
    ``jitter``; only failures ``retry_on`` accepts are retried, others are raised at once."""

    tries: int = 4
    backoff: float = 0.05
    backoff_max: float = 1.0
    jitter: float = 0.5
    retry_on: Callable[[BaseException], bool] = transient

    def wait(self, attempt: int) -> float:
        """The wait after failed attempt ``attempt`` (0 is the first)."""
        cap = min(self.backoff_max, self.backoff * 2.0**attempt)
        return cap * (1.0 - self.jitter * random.random())

    def pause(self, attempt: int) -> None:
        time.sleep(self.wait(attempt))

    def call[T](self, call: Callable[[], T]) -> T:
        """``call()``, again after each retryable failure; ``call`` must be safe to repeat."""
        for attempt in range(self.tries):
            try:
                return call()
            except Exception as e:
                if attempt == self.tries - 1 or not self.retry_on(e):
                    raise
            self.pause(attempt)
        raise AssertionError("unreachable")


# requests through a store's client: client libraries retry most transient S3 errors themselves,
# but not all (obstore gives up on a response body cut short); every such request here may be
# repeated safely (gets, whole-object puts, deletes, listings)
STORE_REQUESTS = RetryPolicy(retry_on=not_missing)


def retry_transient[T](call: Callable[[], T], tries: int = 4) -> T:
    """``call()`` again after a :func:`transient` failure: for zarr-python's own metadata
    requests, which do not go through a :class:`~shardwise.storage.store.ShardStore`. ``call`` must
    be safe to repeat."""
    return RetryPolicy(tries=tries).call(call)
