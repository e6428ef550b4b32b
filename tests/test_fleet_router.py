"""The router's relay of a decoder replica's stream (edgeinfer/fleet/router.py ``relay``) and its ``cancel``,
without Ray: a replica whose node went silent sends nothing more and raises nothing until Ray declares the node
dead (about a minute); the relay ends such a stream after ``--timeout-s`` without a chunk. The stream stands in
for Ray Serve's streaming handle (``DeploymentResponseGenerator``: async iteration and ``cancel()``)."""

from __future__ import annotations

import asyncio
import json
import threading
import time

from edgeinfer.fleet.router import cancel, relay


class SilentNodeStream:
    """Yields ``chunks`` ``gap_s`` apart, then (``silent``) waits forever, as a stream on a lost node."""

    def __init__(self, chunks: list[bytes], gap_s: float = 0.0, silent: bool = True):
        self.chunks, self.gap_s, self.silent, self.cancelled = list(chunks), gap_s, silent, False

    def __aiter__(self) -> SilentNodeStream:
        return self

    async def __anext__(self) -> bytes:
        if not self.chunks:
            if not self.silent:
                raise StopAsyncIteration
            await asyncio.Event().wait()
        await asyncio.sleep(self.gap_s)
        return self.chunks.pop(0)

    def cancel(self) -> None:
        self.cancelled = True


def _relayed(stream: SilentNodeStream, idle_s: float) -> list[bytes]:
    async def read() -> list[bytes]:
        return [chunk async for chunk in relay(stream, idle_s)]

    return asyncio.run(asyncio.wait_for(read(), 30))  # a hang fails here, not the suite


CHUNKS = [b'data: {"n": 1}\n\n', b'data: {"n": 2}\n\n']


def test_a_stream_whose_replica_goes_silent_ends_with_a_timeout_event_and_done_and_is_cancelled():
    stream = SilentNodeStream(CHUNKS)
    out = _relayed(stream, 0.2)
    assert out[:2] == CHUNKS, out
    tail = b"".join(out[2:]).decode()
    event, done = tail.split("\n\n")[:2]
    error = json.loads(event[len("data: "):])["error"]
    assert error["code"] == 504 and error["type"] == "timeout", error
    assert "sent nothing for 0.2 s" in error["message"] and "incomplete" in error["message"], error
    assert done == "data: [DONE]" and tail.endswith("\n\n"), tail
    assert stream.cancelled, "the replica's generation was not cancelled"


def test_the_bound_is_between_chunks_not_on_the_whole_stream():
    """Four chunks 0.2 s apart (0.8 s in all) under a 0.6 s bound: all relayed, nothing cancelled."""
    chunks = [b"data: %d\n\n" % i for i in range(4)] + [b"data: [DONE]\n\n"]
    stream = SilentNodeStream(chunks[:4], gap_s=0.2, silent=False)
    stream.chunks.append(chunks[4])
    assert _relayed(stream, 0.6) == chunks
    assert not stream.cancelled


class BlockingCancel:
    """A handle call whose ``cancel`` blocks, as Serve's does with its router in a separate loop (it waits for the
    request's replica assignment, then ``ray.cancel``)."""

    def __init__(self, separate_loop: bool):
        self._is_router_running_in_separate_loop = separate_loop
        self.release, self.cancelled_in = threading.Event(), None

    def cancel(self) -> None:
        self.cancelled_in = threading.current_thread()
        self.release.wait(5)


def test_a_blocking_cancel_does_not_hold_the_event_loop():
    response = BlockingCancel(separate_loop=True)

    async def main() -> float:
        t0 = time.monotonic()
        cancel(response)
        await asyncio.sleep(0.05)  # the loop still runs other work: another request, a /metrics scrape
        took = time.monotonic() - t0
        response.release.set()
        return took

    assert asyncio.run(main()) < 1.0
    assert response.cancelled_in is not None and response.cancelled_in is not threading.main_thread()


def test_without_serves_separate_loop_cancel_is_called_in_the_loop():
    """Then its futures belong to the event loop and must not be touched from another thread."""
    response = BlockingCancel(separate_loop=False)
    response.release.set()

    async def main() -> None:
        cancel(response)

    asyncio.run(main())
    assert response.cancelled_in is threading.main_thread()
