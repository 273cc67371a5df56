"""Stop signals by name: CRI's Signal names and an image config's StopSignal, as containerd reads them."""

from __future__ import annotations

import signal

import pytest

from shim.cri import signals
from shim.cri.api import api_pb2


def test_every_name_of_cris_signal_enum_is_a_signal_whose_name_is_one_of_cris() -> None:
    names = set(api_pb2.Signal.keys())
    for name in names - {signals.RUNTIME_DEFAULT}:
        number = signals.from_cri(name)
        assert number is not None and signals.to_cri(number) in names
        assert signals.from_cri(signals.to_cri(number)) == number  # SIGCLD comes back as SIGCHLD, the same signal
    assert signals.from_cri(signals.RUNTIME_DEFAULT) is None


def test_real_time_signals_are_named_from_both_ends_as_cri_names_them() -> None:
    assert signals.from_cri("SIGNAL_SIGRTMINPLUS3") == signal.SIGRTMIN + 3
    assert signals.from_cri("SIGNAL_SIGRTMAXMINUS1") == signal.SIGRTMAX - 1
    assert signals.to_cri(signal.SIGRTMIN + 15) == "SIGNAL_SIGRTMINPLUS15"
    assert signals.to_cri(signal.SIGRTMIN + 16) == f"SIGNAL_SIGRTMAXMINUS{signal.SIGRTMAX - signal.SIGRTMIN - 16}"


def test_unset_is_the_runtimes_default_and_anything_else_is_refused_with_a_sentence() -> None:
    assert signals.from_cri(None) is None and signals.from_cri(0) is None
    for bad in (999, "SIGQUIT", "SIGNAL_SIGNOPE", "SIGNAL_SIGRTMINPLUS99"):
        with pytest.raises(ValueError, match="is not one of CRI's Signal names"):
            signals.from_cri(bad)


def test_an_images_stop_signal_is_a_name_with_or_without_sig_or_a_number() -> None:
    assert signals.from_image("SIGQUIT") == signals.from_image("quit") == signals.from_image("3") == signal.SIGQUIT
    assert signals.from_image("SIGRTMIN+3") == signal.SIGRTMIN + 3
    for bad in ("SIGNOPE", "0", "32", "65", "SIGRTMIN+40", "SIGRTMINx", ""):
        with pytest.raises(ValueError, match="is not a signal"):
            signals.from_image(bad)
