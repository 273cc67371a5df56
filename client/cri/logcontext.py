"""Which pod and container a log line is about: ``pod_id=`` and ``container_id=`` on every line
logged while the pod layer works on one, whoever logs it (the pod layer, the Controller, the CNI
runner, podshimd's handlers), in one format.

The pod layer says what it works on with :func:`about` (a context variable: tasks started inside
inherit it); a line may also name its ids itself with ``extra={"pod_id": ..., "container_id": ...}``, and
the pod's name with ``"pod_namespace"`` and ``"pod_name"`` (printed as ``pod=NAMESPACE/NAME``).
:class:`IdsFilter` on a handler puts both on every record (empty when unknown) and
:data:`FORMAT` prints them after the logger's name, only when set::

    2026-12-01T04:40:00.123Z INFO client.cri.pod[812] pod_id=5c0f... container_id=9ab1...: container started
"""

from __future__ import annotations

import contextvars
import logging
import time

__all__ = ["FORMAT", "DATE_FORMAT", "IdsFilter", "about", "current", "install"]

POD_ID: contextvars.ContextVar[str] = contextvars.ContextVar("pod_id", default="")
CONTAINER_ID: contextvars.ContextVar[str] = contextvars.ContextVar("container_id", default="")

#: The one line format of a process that runs the pod layer (podshimd).
FORMAT = "%(asctime)s.%(msecs)03dZ %(levelname)s %(name)s[%(process)d]%(ids)s: %(message)s"
DATE_FORMAT = "%Y-%m-%dT%H:%M:%S"


class about:
    """Lines logged inside the block (and in tasks started there) are about this pod and
    container; an id not given (empty) keeps the one in effect. ``with`` or ``async with``."""

    def __init__(self, pod_id: str = "", container_id: str = ""):
        self._ids = ((POD_ID, pod_id), (CONTAINER_ID, container_id))
        self._tokens: list[tuple[contextvars.ContextVar[str], contextvars.Token[str]]] = []

    def __enter__(self) -> None:
        self._tokens = [(var, var.set(value)) for var, value in self._ids if value]

    def __exit__(self, *exc: object) -> None:
        for var, token in reversed(self._tokens):
            var.reset(token)

    async def __aenter__(self) -> None:
        self.__enter__()

    async def __aexit__(self, *exc: object) -> None:
        self.__exit__()


def current() -> tuple[str, str]:
    """(pod id, container id) in effect here ("" when none)."""
    return POD_ID.get(), CONTAINER_ID.get()


class IdsFilter(logging.Filter):
    """Sets ``pod_id``, ``container_id`` (from ``extra`` or :func:`about`) and ``ids`` (the text
    FORMAT prints) on every record; drops none."""

    def filter(self, record: logging.LogRecord) -> bool:
        pod_id = getattr(record, "pod_id", "") or POD_ID.get()
        container_id = getattr(record, "container_id", "") or CONTAINER_ID.get()
        record.pod_id, record.container_id = pod_id, container_id
        pod = "/".join(filter(None, (getattr(record, "pod_namespace", ""), getattr(record, "pod_name", ""))))
        record.ids = ((f" pod_id={pod_id}" if pod_id else "") + (f" container_id={container_id}" if container_id else "")
                      + (f" pod={pod}" if pod else ""))
        return True


def install(logger: logging.Logger | None = None) -> None:
    """Give every handler of ``logger`` (the root's by default) :data:`FORMAT` in UTC and an
    :class:`IdsFilter`."""
    formatter = logging.Formatter(FORMAT, DATE_FORMAT)
    formatter.converter = time.gmtime
    for handler in (logger or logging.getLogger()).handlers:
        handler.setFormatter(formatter)
        if not any(isinstance(f, IdsFilter) for f in handler.filters):
            handler.addFilter(IdsFilter())
