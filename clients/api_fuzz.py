"""Schema-driven fuzzing of the OpenAI frontend with schemathesis (issue 23): every operation of
``/openapi.json``, a stated number of examples each, and a report of what came back.

Run against a running frontend (loopback only; schemathesis lives in its own venv,
``scripts/setup_fuzz.sh``)::

    python -m clients.api_fuzz --url http://127.0.0.1:9000 [--max-examples 25] [--seed 1]

What it does:

1. ``seed_fixtures``: creates what the id-taking operations need (a voice consent, a designed
   voice, a video job when a video model is served) and reads the served model names;
2. writes a ``schemathesis.toml`` whose dictionaries offer those ids and model names for the
   ``video_id``/``voice_id``/``consent_id``/``model_id`` path parameters and the ``model``
   fields (with probability 0.5, so half the cases still get generated strings), so the
   generated requests get past "no such model/id" into the real validation;
3. runs ``schemathesis run`` with ``--max-examples`` per operation (fuzzing phase; the coverage
   and stateful phases add their own cases) and the checks :data:`CHECKS`, recording every
   exchange in a HAR file;
4. reads the HAR and the JSON report into a :class:`FuzzReport`: operations tested, cases and
   requests per operation, statuses, each 5xx, each check failure.

No pytest here: ``tests/unit/test_openapi_fuzz.py`` runs it against the real app on a fake
engine, ``tests/e2e/test_malformed.py`` against the real stack.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

#: Every response must pass these (schemathesis check names): no 5xx; status, content type,
#: headers and body as the OpenAPI document says (the error shape included).
#: ``positive_data_acceptance`` is left out: the schema cannot say which model names exist or
#: which sizes a given model takes, so schema-valid requests are rightly refused with a 4xx.
CHECKS = ("not_a_server_error", "status_code_conformance", "content_type_conformance",
          "response_headers_conformance", "response_schema_conformance", "negative_data_rejection",
          "allow_header_conformance", "unsupported_method")


#: The operations that make a model generate (speech, images, chat, videos, clone prompts):
#: left out against a real stack (``CHEAP_ONLY``), where a generated valid request can cost
#: seconds to minutes of CPU; the fake-engine run covers them.
GENERATING_OPERATIONS = (
    "create_speech_v1_audio_speech_post", "create_speech_batch_v1_audio_speech_batch_post",
    "create_voice_v1_audio_voices_post", "create_image_v1_images_generations_post", "edit_image_v1_images_edits_post",
    "create_video_v1_videos_post", "create_video_sync_v1_videos_sync_post",
    "create_chat_completion_v1_chat_completions_post", "create_completion_v1_completions_post",
    "create_audio_generation_v1_audio_generate_post")
CHEAP_ONLY = [arg for op in GENERATING_OPERATIONS for arg in ("--exclude-operation-id", op)]


def fuzz_venv() -> Path:
    """The schemathesis venv of ``scripts/setup_fuzz.sh`` (``OMNI_TRITON_FUZZ_VENV`` or
    ``<cache>/fuzz-venv``)."""
    if os.environ.get("OMNI_TRITON_FUZZ_VENV"):
        return Path(os.environ["OMNI_TRITON_FUZZ_VENV"])
    cache = Path(os.environ.get("OMNI_TRITON_CACHE", Path.home() / ".cache" / "omni-triton"))
    return cache / "fuzz-venv"


def _wav(seconds: float = 1.0, rate: int = 16000) -> bytes:
    import numpy as np
    import soundfile as sf

    t = np.arange(int(seconds * rate)) / rate
    buf = io.BytesIO()
    sf.write(buf, (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), rate, format="WAV")
    return buf.getvalue()


def seed_fixtures(url: str, headers: dict | None = None) -> dict[str, list[str]]:
    """Objects for the id-taking operations, created through the API: ``consent_id``,
    ``voice_id``, ``video_id`` (when a video model is served) and the served ``model`` names.
    Returns name -> values (an empty list when the server could not make one)."""
    import httpx

    out: dict[str, list[str]] = {"consent_id": [], "voice_id": [], "video_id": [], "model": []}
    with httpx.Client(base_url=url, timeout=60, headers=headers or {}) as c:
        r = c.get("/v1/models")
        if r.status_code == 200:
            out["model"] = [m["id"] for m in r.json()["data"]]
        r = c.post("/v1/audio/voice_consents", data={"name": "fuzz", "language": "en"},
                   files={"recording": ("consent.wav", _wav(), "audio/wav")})
        if r.status_code == 200:
            out["consent_id"].append(r.json()["id"])
        r = c.post("/v1/audio/voices", data={"name": "fuzz-voice", "type": "prompt", "prompt": "a calm voice"})
        if r.status_code == 200:
            out["voice_id"].append(r.json()["id"])
        r = c.post("/v1/videos", data={"prompt": "a fox"})
        if r.status_code == 200:
            out["video_id"].append(r.json()["id"])
    return out


def config_toml(fixtures: dict[str, list[str]], probability: float = 0.5) -> str:
    """A ``schemathesis.toml`` offering ``fixtures`` as dictionaries for the path parameters of
    the same name and for the ``model`` fields (``model_id`` path parameter, ``model`` query
    parameter and body field)."""
    lines = []
    bindings = {"video_id": ["path.video_id"], "voice_id": ["path.voice_id"], "consent_id": ["path.consent_id"],
                "model": ["path.model_id", "query.model", "body.model"]}
    params = []
    for name, values in fixtures.items():
        if not values or name not in bindings:
            continue
        lines += [f"[dictionaries.{name}]", f"values = {json.dumps(values)}", ""]
        params += [f'"{key}" = {{ dictionary = "{name}", probability = {probability} }}' for key in bindings[name]]
    if params:
        lines += ["[parameters]"] + params
    return "\n".join(lines) + "\n"


@dataclass
class FuzzReport:
    """What one schemathesis run found.

    operations: operations tested (of ``operations_selected`` by the filters, of the schema's
    ``operations_total``); max_examples: ``--max-examples``;
    cases: test cases schemathesis generated; requests: (method, path template) -> requests
    sent; other_requests: requests with a method the path does not have (405 expected);
    statuses: status -> count over every response; server_errors: (method, url, status,
    body) of each 5xx; failures: schemathesis's failures (check code, title, operations);
    seconds: wall time of the run; exit_code: schemathesis's.
    """

    operations: int = 0
    operations_selected: int = 0
    operations_total: int = 0
    max_examples: int = 0
    cases: int = 0
    requests: Counter = field(default_factory=Counter)
    statuses: Counter = field(default_factory=Counter)
    server_errors: list[tuple[str, str, int, str]] = field(default_factory=list)
    failures: list[dict] = field(default_factory=list)
    warnings: dict = field(default_factory=dict)
    other_requests: int = 0
    seconds: float = 0.0
    exit_code: int = 0
    output: str = ""

    def count_5xx(self) -> int:
        return sum(n for s, n in self.statuses.items() if s >= 500)

    def summary(self) -> str:
        per_op = sorted(self.requests.values())
        selected = ("" if self.operations_selected == self.operations_total
                    else f" ({self.operations_selected} selected)")
        return (f"operations {self.operations}/{self.operations_total}{selected}, --max-examples {self.max_examples}, "
                f"{self.cases} cases: {sum(per_op)} requests to {len(per_op)} operations (per operation min "
                f"{per_op[0] if per_op else 0}, median {per_op[len(per_op) // 2] if per_op else 0}, max "
                f"{per_op[-1] if per_op else 0}) + {self.other_requests} with unsupported methods, "
                f"statuses {dict(sorted(self.statuses.items()))}, 5xx {self.count_5xx()}, "
                f"check failures {sum(f.get('count', 1) for f in self.failures)}, {self.seconds:.1f} s")


def _template(paths: list[str], url_path: str) -> str:
    """The OpenAPI path template that ``url_path`` instantiates (``/v1/videos/{video_id}``)."""
    parts = url_path.rstrip("/").split("/")
    for template in sorted(paths, key=lambda p: p.count("{")):
        t = template.split("/")
        if len(t) == len(parts) and all(a == b or a.startswith("{") for a, b in zip(t, parts, strict=True)):
            return template
    return url_path


def run(url: str, out_dir: Path | str, max_examples: int = 25, seed: int = 1, checks=CHECKS,
        phases: str = "examples,coverage,fuzzing,stateful", fixtures: dict | None = None,
        headers: dict | None = None, include: list[str] | None = None, timeout_s: float = 900) -> FuzzReport:
    """Fuzz the frontend at ``url`` (see the module docstring); files go to ``out_dir``.

    ``fixtures``: ids and model names for the dictionaries (default: ``seed_fixtures(url)``);
    ``include``: extra ``schemathesis run`` filter options (e.g. :data:`CHEAP_ONLY`).
    Raises FileNotFoundError when the schemathesis venv is missing.
    """
    import time
    from urllib.parse import urlsplit

    import httpx

    exe = fuzz_venv() / "bin" / "schemathesis"
    if not exe.exists():
        raise FileNotFoundError(f"{exe} is missing: run scripts/setup_fuzz.sh")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if fixtures is None:
        fixtures = seed_fixtures(url, headers)
    config = out / "schemathesis.toml"
    config.write_text(config_toml(fixtures))
    cmd = [str(exe), "--config-file", str(config), "--no-color", "run", f"{url}/openapi.json",
           "--max-examples", str(max_examples), "--seed", str(seed), "--checks", ",".join(checks),
           "--phases", phases, "--generation-database", "none", "--workers", "1", "--request-timeout", "60",
           "--report", "json,har", "--report-dir", str(out),
           "--report-json-path", str(out / "report.json"), "--report-har-path", str(out / "exchanges.har")]
    for name, value in (headers or {}).items():
        cmd += ["--header", f"{name}: {value}"]
    cmd += include or []
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=out)
    report = FuzzReport(max_examples=max_examples, seconds=time.monotonic() - t0, exit_code=proc.returncode,
                        output=proc.stdout + proc.stderr)
    if not (out / "report.json").exists():
        raise RuntimeError(f"schemathesis wrote no report (exit {proc.returncode}):\n{report.output[-4000:]}")
    data = json.loads((out / "report.json").read_text())
    report.operations = data["operations"]["tested"]
    report.operations_selected = data["operations"]["selected"]
    report.operations_total = data["operations"]["total"]
    report.cases = data["test_cases"]["generated"]
    report.failures = data.get("failures") or []
    report.warnings = {k: v for k, v in (data.get("warnings") or {}).items() if v}
    doc = httpx.get(f"{url}/openapi.json", headers=headers or {}, timeout=30).json()["paths"]
    paths = list(doc)
    for entry in json.loads((out / "exchanges.har").read_text())["log"]["entries"]:
        method, target = entry["request"]["method"], urlsplit(entry["request"]["url"]).path
        status = entry["response"]["status"]
        template = _template(paths, target)
        if method.lower() in doc.get(template, {}):  # an operation (not a probe with an unsupported method)
            report.requests[(method, template)] += 1
        else:
            report.other_requests += 1
        report.statuses[status] += 1
        if status >= 500:
            body = (entry["response"].get("content") or {}).get("text") or ""
            report.server_errors.append((method, entry["request"]["url"], status, body[:300]))
    return report


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m clients.api_fuzz", description=__doc__.split("\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:9000", help="frontend URL (loopback)")
    p.add_argument("--out", default="fuzz-report", help="folder for the config, HAR and JSON report")
    p.add_argument("--max-examples", type=int, default=25, help="examples per operation (fuzzing phase)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--api-key", default=None)
    p.add_argument("--cheap-only", action="store_true",
                   help="leave out the operations that make a model generate (for a real stack on CPUs)")
    args = p.parse_args(argv)
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else None
    report = run(args.url, args.out, args.max_examples, args.seed, headers=headers,
                 include=CHEAP_ONLY if args.cheap_only else None)
    print(report.summary())
    for method, url, status, body in report.server_errors[:20]:
        print(f"5xx: {status} {method} {url}: {body}")
    for f in report.failures:
        print(f"FAIL {f.get('code')} {f.get('title')}: {f.get('count')} ({', '.join(f.get('operations', []))})")
    return 1 if report.server_errors or report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
