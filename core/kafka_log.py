"""One line, not a traceback, for kafka-python's closed-socket race.

kafka-python 3's network thread catches every exception a task raises and logs it at ERROR with
its traceback (``kafka.net.selector: Unhandled exception in task``). One of them is a race of its
own, not a fault: a connection the broker (or a restart of it) closed while a read on it was
being registered — ``KeyError: '<socket.socket [closed] fd=-1 ...> is not registered'``, then
``ValueError: Invalid file descriptor: -1``. The connection is gone already and the client
reconnects by itself (the soak saw it after a broker or controller restart, nothing lost). A
two-screen traceback in the controller's log for that reads like a crash, so this filter turns
exactly that case into one WARNING line and counts it.

The same for a connection the broker dropped (``kafka.net.transport: Error receiving network data
closing socket`` with ``ConnectionResetError``): the error text stays on the line, the traceback of
a ``recv`` goes (a broker that restarts is an outage, which cliffguard's own components report,
not a bug); so for a read on a transport that closed under it (``AttributeError: 'NoneType' object
has no attribute 'recv'``), and for an ``OSError`` whose errno says the peer is gone
(``ENOTCONN``: ``kafka.net.connection: Failed to build connection log_prefix`` when the broker
dropped a connection before its ``getpeername``, seen in a soak seed's broker kill; ``OSError`` but
no ``ConnectionError``). And for the client closing a cancelled task while its network thread runs
it (``ValueError: generator already executing``, at a controller's SIGTERM). Every other exception
kafka-python reports keeps its traceback.
"""

from __future__ import annotations

import errno
import logging

SELECTOR_LOGGER = "kafka.net.selector"


def _closed_socket_race(record: logging.LogRecord) -> bool:
    exc = record.exc_info[1] if record.exc_info else None
    if not record.getMessage().startswith("Unhandled exception in task") or exc is None:
        return False
    chain = []
    while exc is not None and len(chain) < 5:
        chain.append(exc)
        exc = exc.__context__
    return any(isinstance(e, ValueError) and "Invalid file descriptor: -1" in str(e) for e in chain) or any(
        isinstance(e, KeyError) and "[closed]" in str(e) and "is not registered" in str(e) for e in chain)


def _cancel_while_running(record: logging.LogRecord) -> bool:
    """kafka-python closing a cancelled task whose coroutine its network thread is running at that
    moment (``Task.close``: ``ValueError: generator already executing``), seen as a controller
    stopped on SIGTERM right after it connected: the client is closing, the task is cancelled."""
    exc = record.exc_info[1] if record.exc_info else None
    return (record.getMessage().startswith("Error closing coroutine for cancelled task")
            and isinstance(exc, ValueError) and "generator already executing" in str(exc))


def _closed_transport(exc: BaseException | None) -> bool:
    """A read or write on a transport whose socket a close already dropped (``self._sock`` is None
    once the transport closed: seen as a controller stopped while a read was pending)."""
    return isinstance(exc, AttributeError) and str(exc) in (
        "'NoneType' object has no attribute 'recv'", "'NoneType' object has no attribute 'send'")


PEER_GONE_ERRNOS = frozenset({errno.ENOTCONN, errno.ESHUTDOWN, errno.ECONNRESET, errno.ECONNABORTED, errno.EPIPE,
                              errno.ECONNREFUSED})
"""Socket errnos that say the other end is gone (some arrive as a plain ``OSError``)."""


def _peer_gone(exc: BaseException | None) -> bool:
    return (isinstance(exc, ConnectionError | TimeoutError) or type(exc).__name__ == "KafkaConnectionError"
            or _closed_transport(exc) or (isinstance(exc, OSError) and exc.errno in PEER_GONE_ERRNOS))


CONNECTION_LOGGERS = ("kafka.net.transport", "kafka.net.connection", "kafka.net.manager", "kafka.conn")
"""kafka-python's loggers that report a dropped connection with the traceback of a socket call."""


class DroppedConnection(logging.Filter):
    """A connection error's traceback (a socket call that failed) folded into its one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if _peer_gone(exc):
            record.msg = f"{record.getMessage()}: {type(exc).__name__}: {exc}"
            record.args = ()
            record.exc_info = None
            record.exc_text = None
        return True


class ClosedSocketRace(logging.Filter):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if _closed_socket_race(record):
            self.count += 1
            record.msg = ("kafka-python: a connection closed while a read on it was being registered "
                          "(a client race after a disconnect; it reconnects by itself) [%d so far]")
            record.args = (self.count,)
            record.exc_info = None
            record.exc_text = None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        elif _cancel_while_running(record):
            record.msg = ("kafka-python: a cancelled task was still running when the client closed "
                          "(a race of its own at shutdown; nothing was lost)")
            record.args = ()
            record.exc_info = None
            record.exc_text = None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def install() -> ClosedSocketRace:
    """Add the filters to kafka-python's loggers once per process; returns the race's."""
    for name in CONNECTION_LOGGERS:
        conn = logging.getLogger(name)
        if not any(isinstance(f, DroppedConnection) for f in conn.filters):
            conn.addFilter(DroppedConnection())
    logger = logging.getLogger(SELECTOR_LOGGER)
    for f in logger.filters:
        if isinstance(f, ClosedSocketRace):
            return f
    f = ClosedSocketRace()
    logger.addFilter(f)
    return f
