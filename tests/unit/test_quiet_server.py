"""openai_frontend.quiet_server.QuietServer: uvicorn's housekeeping loop wakes once a second, not
ten times (an idle frontend costs nothing, issue 28 item 4), and still refreshes the date header
on every tick (uvicorn does it when ``counter % 10 == 0``)."""
from __future__ import annotations

import asyncio

import uvicorn

from openai_frontend import quiet_server
from openai_frontend.quiet_server import QuietServer


def test_the_loop_sleeps_a_second_per_tick_and_each_tick_refreshes_the_date(monkeypatch):
    server = QuietServer(uvicorn.Config(app=None))
    ticks: list[int] = []
    sleeps: list[float] = []

    async def on_tick(counter: int) -> bool:
        ticks.append(counter)
        return len(ticks) == 4  # exit at the 4th tick

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)

    monkeypatch.setattr(server, "on_tick", on_tick)
    monkeypatch.setattr(quiet_server.asyncio, "sleep", sleep)
    asyncio.run(server.main_loop())
    assert sleeps == [1.0, 1.0, 1.0]
    assert all(counter % 10 == 0 for counter in ticks) and len(set(ticks)) == 4
