"""uvicorn's ``Server`` with a once-a-second housekeeping tick instead of ten times a second.

uvicorn's ``Server.main_loop`` wakes every 0.1 s to refresh the ``date`` header (once a second)
and to see whether a signal asked it to exit. On an idle frontend those 10 wake-ups a second
were most of its CPU (issue 28 item 4: an idle server costs nothing). :class:`QuietServer` wakes
once a second: the ``date`` header keeps its one-second resolution, and a SIGTERM/SIGINT is
acted on within a second (serve waits 10 s for the frontend to stop).
"""
from __future__ import annotations

import asyncio

import uvicorn

#: seconds between two housekeeping ticks (uvicorn: 0.1). A bare wake-up costs ~130-170 us on the
#: 2-core dev VM (10/s: 0.13% of a core, 1/s: 0.02%), uvicorn's tick work comes on top: a lone idle
#: frontend's event-loop thread went from 1.07% to 0.7% of a core with this alone (indicative:
#: measured while other sessions loaded the box).
TICK_S = 1.0
#: uvicorn's on_tick refreshes the date header when ``counter % 10 == 0`` (10 ticks of 0.1 s)
_UVICORN_TICKS_PER_S = 10


class QuietServer(uvicorn.Server):
    """``uvicorn.Server`` whose main loop ticks every :data:`TICK_S` seconds."""

    async def main_loop(self) -> None:
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            # every tick is a "whole second" for uvicorn: the date header is refreshed each time
            counter = (counter + _UVICORN_TICKS_PER_S) % 864000
            await asyncio.sleep(TICK_S)
            should_exit = await self.on_tick(counter)
