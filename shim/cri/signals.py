"""A container's stop signal by name: CRI's ``Signal`` names (``SIGNAL_SIGQUIT``,
``SIGNAL_SIGRTMINPLUS3``, ``SIGNAL_SIGRTMAXMINUS1``) and an OCI image config's ``StopSignal``
(``SIGQUIT``, ``QUIT``, ``3``, ``SIGRTMIN+3``) as the signal's number, and a number back as CRI's
name, as containerd reads and reports them."""

from __future__ import annotations

import signal

__all__ = ["DEFAULT_STOP", "RUNTIME_DEFAULT", "from_cri", "from_image", "to_cri"]

#: What StopContainer sends first when neither the container nor its image names a signal.
DEFAULT_STOP = signal.SIGTERM

#: CRI's name for "the image's stop signal, else SIGTERM".
RUNTIME_DEFAULT = "SIGNAL_RUNTIME_DEFAULT"
_CRI_PREFIX = "SIGNAL_"
#: CRI names real-time signals from both ends: SIGRTMIN, SIGRTMINPLUS1..15, SIGRTMAXMINUS14..1, SIGRTMAX.
_RT_FROM_MIN = 15
_NAMED = frozenset(int(sig) for sig in signal.Signals)


def _number(name: str) -> int | None:
    """The number of signal ``name`` (``SIGQUIT``, ``QUIT``, ``SIGRTMIN+3``, ``SIGRTMAX-2``; any
    case); None when no signal has that name."""
    upper = name.upper()
    upper = upper if upper.startswith("SIG") else "SIG" + upper
    for base, number in (("SIGRTMIN", signal.SIGRTMIN), ("SIGRTMAX", signal.SIGRTMAX)):
        if upper.startswith(base):
            rest = upper[len(base):]
            if rest and (rest[0] not in "+-" or not rest[1:].isdigit()):
                return None
            found = number + (int(rest) if rest else 0)
            return found if signal.SIGRTMIN <= found <= signal.SIGRTMAX else None
    try:
        return int(signal.Signals[upper])
    except KeyError:
        return None


def from_cri(value: object) -> int | None:
    """The signal CRI's ``stop_signal`` names (None for RUNTIME_DEFAULT, or 0 as protobuf's
    default). Raises ValueError with a sentence for anything else."""
    if value in (None, 0, RUNTIME_DEFAULT):
        return None
    if isinstance(value, str) and value.upper().startswith(_CRI_PREFIX):
        name = value.upper()[len(_CRI_PREFIX):].replace("PLUS", "+", 1).replace("MINUS", "-", 1)
        number = _number(name)
        if number is not None:
            return number
    raise ValueError(f"{value!r} is not one of CRI's Signal names (SIGNAL_SIGTERM, SIGNAL_SIGQUIT, "
                     "SIGNAL_SIGRTMINPLUS1, ...)")


def from_image(text: str) -> int:
    """The signal an image config's ``StopSignal`` names, by name or number. Raises ValueError
    with a sentence when it names none."""
    stripped = text.strip()
    if stripped.isdigit():
        number = int(stripped)
        if signal.SIGRTMIN <= number <= signal.SIGRTMAX or number in _NAMED:
            return number
    elif (found := _number(stripped)) is not None:
        return found
    raise ValueError(f"StopSignal {text!r} is not a signal")


def to_cri(number: int) -> str:
    """CRI's name of signal ``number`` (``SIGNAL_SIGTERM``, ``SIGNAL_SIGRTMINPLUS3``)."""
    if signal.SIGRTMIN <= number <= signal.SIGRTMAX:
        above = number - signal.SIGRTMIN
        if above == 0:
            return f"{_CRI_PREFIX}SIGRTMIN"
        if above <= _RT_FROM_MIN:
            return f"{_CRI_PREFIX}SIGRTMINPLUS{above}"
        below = signal.SIGRTMAX - number
        return f"{_CRI_PREFIX}SIGRTMAX" + (f"MINUS{below}" if below else "")
    return _CRI_PREFIX + signal.Signals(number).name
