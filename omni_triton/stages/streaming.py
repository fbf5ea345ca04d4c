"""Streaming out of transformers ``generate``: run it on a thread and hand over what its streamer
queues, with a stopping criterion that ends it early (consumer gone or request cancelled).
Shared by the CSM talker and the Qwen3-Omni thinker and talker."""
from __future__ import annotations

import queue
import threading
from typing import Callable, Iterator

import torch


def stopping_criteria(should_stop: Callable[[torch.Tensor], bool]):
    """A transformers ``StoppingCriteria`` calling ``should_stop(input_ids)`` after every step."""
    from transformers import StoppingCriteria

    class _Stop(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return torch.full((input_ids.shape[0],), bool(should_stop(input_ids)), dtype=torch.bool)

    return _Stop()


def threaded_generate(run: Callable[[], object], q: "queue.Queue", done: object, closed: threading.Event,
                      name: str = "generate") -> Iterator:
    """Run ``run()`` on a thread (one torch thread); yield the lists of items it queues (batched by
    what is already there) until it returns, then its return value; re-raise its exception.
    Closing the generator early sets ``closed`` (``run``'s stopping criterion must watch it) and
    joins the thread."""
    box: dict = {}

    def target():
        try:
            torch.set_num_threads(1)
            with torch.inference_mode():
                box["result"] = run()
        except BaseException as e:  # re-raised in the consumer
            box["error"] = e
        finally:
            q.put(done)

    th = threading.Thread(target=target, name=name, daemon=True)
    th.start()
    try:
        finished = False
        while not finished:
            items = [q.get()]
            while True:
                try:
                    items.append(q.get_nowait())
                except queue.Empty:
                    break
            if items[-1] is done:
                items.pop()
                finished = True
            yield items
    finally:
        closed.set()
        th.join()
    if "error" in box:
        raise box["error"]
    yield box.get("result")  # last item: generate's return value
