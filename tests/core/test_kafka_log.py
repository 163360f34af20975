"""core/kafka_log.py: kafka-python's closed-socket race becomes one WARNING line; any other
exception kafka-python reports keeps its traceback."""

from __future__ import annotations

import logging
import socket

from cliffguard.core import kafka_log


def _logged(make_exc, name: str = kafka_log.SELECTOR_LOGGER, msg: str = "Unhandled exception in task %s:"
            ) -> logging.LogRecord:  # noqa: ANN001
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logger = logging.getLogger(name)
    handler = Keep()
    logger.addHandler(handler)
    try:
        try:
            make_exc()
        except Exception:  # noqa: BLE001
            logger.error(msg, "<Task>", exc_info=True)
    finally:
        logger.removeHandler(handler)
    (record,) = records
    return record


def _closed_socket_race() -> None:
    sock = socket.socket()
    sock.close()
    try:
        raise KeyError(f"{sock!r} is not registered")
    except KeyError:  # what selectors does next: the ValueError, with the KeyError as its context
        raise ValueError("Invalid file descriptor: -1")  # noqa: B904 - the chain as kafka-python logs it


def test_the_closed_socket_race_is_one_warning_line_and_counted():
    f = kafka_log.install()
    assert kafka_log.install() is f  # once per process
    before = f.count
    record = _logged(_closed_socket_race)
    assert record.levelno == logging.WARNING and record.exc_info is None
    assert "reconnects by itself" in record.getMessage() and f.count == before + 1


def test_any_other_exception_keeps_its_traceback():
    kafka_log.install()

    def other() -> None:
        raise RuntimeError("a real bug in a task")

    record = _logged(other)
    assert record.levelno == logging.ERROR and record.exc_info is not None


def test_a_dropped_connection_keeps_its_error_on_one_line_without_the_socket_traceback():
    kafka_log.install()

    def reset() -> None:
        raise ConnectionResetError(104, "Connection reset by peer")

    record = _logged(reset, "kafka.net.transport", "%s: Error receiving network data closing socket")
    assert record.exc_info is None and record.levelno == logging.ERROR
    assert record.getMessage() == ("<Task>: Error receiving network data closing socket: ConnectionResetError: "
                                   "[Errno 104] Connection reset by peer")


def test_a_read_on_a_transport_that_closed_under_it_is_one_line():
    """The soak's seed 18: a controller stopped while a read was pending logged the recv's traceback."""
    kafka_log.install()

    def closed() -> None:
        sock = None
        sock.recv(4096)  # type: ignore[attr-defined]

    record = _logged(closed, "kafka.net.transport", "%s: Error receiving network data closing socket")
    assert record.exc_info is None
    assert record.getMessage().endswith("AttributeError: 'NoneType' object has no attribute 'recv'")

    def other() -> None:
        raise AttributeError("'Foo' object has no attribute 'bar'")

    assert _logged(other, "kafka.net.transport", "%s: Error receiving network data closing socket").exc_info


def test_a_peer_gone_errno_in_a_plain_oserror_is_one_line_and_another_oserror_keeps_its_traceback():
    """The soak smoke's seed 2 (a broker kill): getpeername on a connection the broker had dropped."""
    import errno

    kafka_log.install()

    def not_connected() -> None:
        raise OSError(errno.ENOTCONN, "Transport endpoint is not connected")

    record = _logged(not_connected, "kafka.net.connection", "%s Failed to build connection log_prefix")
    assert record.exc_info is None
    assert record.getMessage() == ("<Task> Failed to build connection log_prefix: OSError: "
                                   "[Errno 107] Transport endpoint is not connected")

    def disk_full() -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    assert _logged(disk_full, "kafka.net.connection", "%s Failed to build connection log_prefix").exc_info


def test_closing_a_task_the_network_thread_is_running_is_one_line_and_another_close_error_keeps_its_traceback():
    """Seen in CI: a controller stopped on SIGTERM right after it connected logged kafka-python's
    ``Task.close`` race (``ValueError: generator already executing``) as a traceback."""
    kafka_log.install()

    def running() -> None:
        def gen():  # noqa: ANN202
            me.close()  # a generator closing itself while it runs: the same ValueError
            yield

        me = gen()
        next(me)

    msg = "Error closing coroutine for cancelled task"
    record = _logged(running, msg=msg + "%s")
    assert record.levelno == logging.WARNING and record.exc_info is None
    assert "still running when the client closed" in record.getMessage()

    def other() -> None:
        raise ValueError("something else")

    record = _logged(other, msg=msg + "%s")
    assert record.levelno == logging.ERROR and record.exc_info is not None
