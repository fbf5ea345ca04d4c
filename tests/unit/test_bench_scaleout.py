"""clients/bench_scaleout.py's pure parts: Triton's success counters per model from a metrics
page, their per-level deltas, and the failover figures from per-request records."""
from clients.bench_scaleout import Request, analyse_failover, delta, successes

TRITON_METRICS = """# HELP nv_inference_request_success Number of successful inference requests, all batch sizes
# TYPE nv_inference_request_success counter
nv_inference_request_success{model="piper",version="1"} 12
nv_inference_request_success{model="csm",version="1"} 3
# HELP nv_inference_request_failure Number of failed inference requests, all batch sizes
# TYPE nv_inference_request_failure counter
nv_inference_request_failure{model="piper",reason="OTHER",version="1"} 7
"""


def test_successes_per_model_and_deltas():
    before = successes(TRITON_METRICS)
    assert before == {"piper": 12.0, "csm": 3.0}  # failures are not counted
    after = successes(TRITON_METRICS.replace("} 12", "} 20"))
    assert delta(after, before) == {"piper": 8}  # models that did not move are left out
    assert delta(after, {}) == {"csm": 3, "piper": 20}


def test_failover_figures():
    results = [
        Request(0, 0.0, 4.0),                                    # before the kill
        Request(1, 4.5, 5.5),                                    # in flight, survived
        Request(2, 4.8, 5.2, status=200, error="RemoteProtocolError"),  # in flight on the victim
        Request(3, 5.1, 5.3, status=503, error="HTTP 503"),      # sent after: not drained yet
        Request(4, 5.4, 6.0, status=200),
        Request(5, 6.2, 6.9, status=200),
        Request(6, 10.5, 10.9, status=500, error="HTTP 500"),    # a 5xx 5 s or more after the kill
    ]
    report = analyse_failover(results, kill_s=5.0, duration_s=20.0)
    assert report["in_flight_at_kill"] == 2 and report["in_flight_failed"] == 1
    assert report["sent_after_kill"] == 4 and report["sent_after_kill_failed"] == 2
    assert report["sent_after_kill_statuses"] == {"503": 1, "200": 2, "500": 1}
    assert report["sent_after_kill_failed_5s_or_later"] == 1
    assert report["requests_lost"] == 3
    assert report["recovery_s"] == 5.9  # the end of the last failure sent after the kill
    assert report["first_success_after_kill_s"] == 1.0
    assert report["requests_per_s_after_kill"] == round(2 / 15.0, 3)
    clean = analyse_failover([r for r in results if r.index in (0, 1, 4, 5)], 5.0, 20.0)
    assert clean["recovery_s"] == 0.0 and clean["requests_lost"] == 0
