"""A fake of what ``omni_triton.serve.supervisor`` (StubWatch, supervise, restart_server) calls on a
``TritonServer``: Triton's repository index, its stub processes and its log as plain lists, so
the supervision logic is tested without tritonserver (tests/unit/test_stub_watch.py,
tests/unit/test_crash_watch.py)."""
from __future__ import annotations

from pathlib import Path


class FakeProc:
    """A ``subprocess.Popen`` stand-in: ``returncode`` None while it runs; no pid (nothing to
    wait on)."""

    def __init__(self, code=None):
        self.returncode = code

    def poll(self):
        return self.returncode

    def wait(self, timeout=None):
        return self.returncode


class FakeServer:
    """A tritonserver whose models, stubs and log lines a test sets.

    Attributes:
        states: model -> Triton index state (``READY``, ``UNLOADING``, ``UNAVAILABLE``).
        instances: model -> stub processes it runs (ensembles: absent).
        alive: model -> live stubs (as serve's tracker would have them after its scan).
        exits: families of stubs that exited, handed out by the next ``reap_exited_stubs``.
        events: models of lifecycle log lines, handed out by the next ``model_events``.
        calls: every reload/kill/scan/index call, in order (``("reload", m)``, ``("index",)``, ...).
    """

    def __init__(self, tmp_path: Path | None = None, models: dict[str, int] | None = None,
                 exit_code=None):
        self.models = list(models or {"piper": 1, "llm": 1, "llm_tts": 1})
        self.repositories: list[Path] = []
        self.log_path = (tmp_path or Path("/nonexistent")) / "tritonserver-1.log"
        self.proc = FakeProc(exit_code)
        self.instances = dict(models or {"piper": 1, "llm": 1, "llm_tts": 1})
        self.states = {m: "READY" for m in self.instances}
        self.reasons: dict[str, str] = {}
        self.alive = dict(self.instances)
        self.exits: list[dict] = []
        self.events: set[str] = set()
        self.calls: list[tuple] = []
        self.fail_reload: set[str] = set()  # reload fails at the load: UNAVAILABLE
        self.fail_unload: set[str] = set()  # reload fails at the unload: still READY, stubs missing

    # -- what a test does to it --------------------------------------------------------------
    def kill(self, model: str, seen: bool = True, children=(4242,)) -> None:
        """One stub of ``model`` dies (``seen``: a scan had seen it, so its family is known)."""
        self.alive[model] -= 1
        if seen:
            self.exits.append({"model": model, "stub_pid": 1000, "killed": list(children),
                               "shm_removed": ["/dev/shm/psm_x"]})

    def unload(self, model: str, state: str = "UNAVAILABLE") -> None:
        """The frontend unloads ``model``: its stubs exit (seen), its state changes."""
        self.states[model] = state
        self.reasons[model] = "unloaded"
        for _ in range(self.alive.get(model, 0)):
            self.kill(model)
        self.events.add(model)

    def load(self, model: str, instances: int = 1) -> None:
        """The frontend loads ``model`` (not in the start list): new stubs, READY, a log line."""
        self.instances[model] = instances
        self.alive[model] = instances
        self.states[model] = "READY"
        self.reasons.pop(model, None)
        self.events.add(model)

    # -- what serve calls --------------------------------------------------------------------
    def model_events(self) -> set[str]:
        events, self.events = self.events, set()
        return events

    def scan_stubs(self, refresh=frozenset()):
        self.calls.append(("scan",))
        return []

    def reap_exited_stubs(self) -> list[dict]:
        exits, self.exits = self.exits, []
        return exits

    def stub_fds(self) -> list[int]:
        return []

    def model_states(self) -> dict[str, tuple[str, str]]:
        self.calls.append(("index",))
        return {m: (s, self.reasons.get(m, "")) for m, s in self.states.items()}

    def models_without_stub(self, ready: set[str]) -> list[str]:
        return [m for m in sorted(ready) if m in self.instances and self.alive.get(m, 0) < self.instances[m]]

    def reload(self, model: str) -> None:
        from omni_triton.serve.process import ServerStartError

        self.calls.append(("reload", model))
        if model in self.fail_unload:
            raise ServerStartError(f"unloading {model} failed: timeout")
        if model in self.fail_reload:
            self.states[model], self.reasons[model] = "UNAVAILABLE", "load failed: out of memory"
            raise ServerStartError(f"loading {model} again failed: out of memory")
        self.alive[model] = self.instances[model]
        self.states[model] = "READY"

    def kill_stubs(self, model: str) -> list[int]:
        self.calls.append(("kill_stubs", model))
        return [4242]

    def fatal_signal(self):
        return None

    def stop(self):
        pass

    def start(self):
        pass

    def wait_ready(self, timeout=None, should_stop=None):
        pass

    def log_text(self):
        return "Signal (11) received.\n"

    def failure_report(self):
        return ""


class Clock:
    """A monotonic clock a test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
