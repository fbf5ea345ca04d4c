"""clients/bench_lora.py without a server: which adapter each request of a burst names, and a
burst's bookkeeping against a fake HTTP client (no timing asserted)."""
from __future__ import annotations

import threading

from clients.bench_lora import burst, lora_for


def test_lora_for_each_mode():
    assert [lora_for("none", i, 3) for i in range(3)] == [None, None, None]
    assert {lora_for("single", i, 3)["name"] for i in range(6)} == {"bench-0"}
    assert [lora_for("mixed", i, 3)["name"] for i in range(6)] == ["bench-0", "bench-1", "bench-2"] * 2


class FakeHttp:
    def __init__(self):
        self.bodies, self.lock = [], threading.Lock()

    def post(self, url, json):
        with self.lock:
            self.bodies.append(json)

        class R:
            status_code = 200 if json["seed"] != 12 else 500
            text = "boom"

        return R()


def test_burst_sends_batch_requests_with_their_adapters():
    http = FakeHttp()
    out = burst(http, "http://x", "mixed", batch=4, adapters=2, size="64x64", steps=2, seed0=10)
    assert sorted(b["seed"] for b in http.bodies) == [10, 11, 12, 13]
    assert {b["seed"]: b["lora"]["name"] for b in http.bodies} == {10: "bench-0", 11: "bench-1", 12: "bench-0",
                                                                   13: "bench-1"}
    assert len(out["latencies_s"]) == 3 and out["errors"] == ["HTTP 500: boom"] and out["wall_s"] >= 0
