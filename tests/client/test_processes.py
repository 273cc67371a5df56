"""client.processes: helpers (CNI plugins, skopeo) run from podshimd's event loop."""

from __future__ import annotations

import asyncio

import uvloop

from client.processes import run

from support.looptools import loop_stalls

#: A daemon this large (podshimd holding many pods): what a fork of it would copy.
BALLAST_BYTES = 512 * 1024 * 1024


def test_starting_helpers_does_not_hold_up_the_event_loop_for_the_size_of_the_daemon():
    # podshimd runs on uvloop, whose own process spawning forks the whole daemon (its page
    # tables copied while the loop waits); a helper must start as a vfork does, in time that
    # does not grow with the daemon, while the loop serves other calls.
    ballast = bytearray(BALLAST_BYTES)
    for i in range(0, len(ballast), 4096):
        ballast[i] = 1  # resident, as a daemon's heap is
    stalls: list[float] = []

    async def main() -> list[tuple[int, bytes, bytes]]:
        async with loop_stalls() as seen:
            done = [await run(["sh", "-c", "cat; echo err >&2; exit 3"], {"PATH": "/usr/bin:/bin"}, b"in", 30, "sh")
                    for _ in range(10)]
        stalls.extend(seen)
        return done

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        done = runner.run(main())
    del ballast
    assert done == [(3, b"in", b"err\n")] * 10
    assert max(stalls) < 0.25, f"the event loop stood still for {max(stalls):.2f} s starting a helper"
