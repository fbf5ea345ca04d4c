"""clients/bench_footprint.py's pure parts on a fake /proc (psutil reads ``psutil.PROCFS_PATH``):
the process tree classified per model and part, PSS sums, idle-CPU deltas, the pss_mib writes and
the JSON shape; and the property the memory budget relies on: every model has its ``pss_mib``."""
from __future__ import annotations

import argparse
import os
from pathlib import Path

import psutil
import pytest

from clients import bench_footprint as bf

ROOT = Path(__file__).resolve().parents[2]
TICKS = os.sysconf("SC_CLK_TCK")


class FakeProc:
    """Writes the few /proc files psutil reads for a process: stat, statm, cmdline, smaps_rollup."""

    def __init__(self, root: Path):
        self.root = root
        (root / "stat").write_text("cpu  1 2 3 4 5 6 7 0 0 0\nbtime 1700000000\n")

    def add(self, pid: int, ppid: int, name: str, cmdline: list[str], pss_kib: int | None,
            utime_s: float = 0.0, stime_s: float = 0.0, start_ticks: int = 5000) -> None:
        d = self.root / str(pid)
        d.mkdir(exist_ok=True)
        fields = ["S", str(ppid), str(pid), str(pid), "0", "-1", "4194304", "0", "0", "0", "0",
                  str(round(utime_s * TICKS)), str(round(stime_s * TICKS)), "0", "0", "20", "0", "1", "0",
                  str(start_ticks), "1000", "10", "18446744073709551615"] + ["0"] * 21
        # comm in parentheses may hold spaces and parentheses (psutil parses from the last ')')
        (d / "stat").write_text(f"{pid} ({name}) " + " ".join(fields) + "\n")
        (d / "statm").write_text("100 20 10 1 0 5 0\n")
        (d / "cmdline").write_bytes(b"\0".join(a.encode() for a in cmdline) + b"\0")
        (d / "status").write_text(f"Name:\t{name}\nPPid:\t{ppid}\nUid:\t0\t0\t0\t0\n")
        rollup = d / "smaps_rollup"
        if pss_kib is None:
            rollup.unlink(missing_ok=True)
        else:
            rollup.write_text(f"00400000-7fff0000 ---p 00000000 00:00 0  [rollup]\nRss:  {pss_kib * 2} kB\n"
                              f"Pss:  {pss_kib} kB\nPss_Anon:  {pss_kib} kB\nShared_Clean: 0 kB\n"
                              "Private_Clean: 0 kB\nPrivate_Dirty: 0 kB\nSwap: 0 kB\nSwapPss: 0 kB\n")


STUB = "/opt/tritonserver/backends/python/triton_python_backend_stub"


@pytest.fixture
def fake_proc(tmp_path, monkeypatch):
    root = tmp_path / "proc"
    root.mkdir()
    monkeypatch.setattr(psutil, "PROCFS_PATH", str(root))
    fp = FakeProc(root)
    # serve 10 -> tritonserver 11 -> stubs 12 (piper), 14, 15 (csm_talker x2) -> EngineCore 13
    #          -> frontend 16 -> worker 17; 18: an unexpected child of serve
    fp.add(10, 1, "omni-triton", ["python", "-m", "omni_triton", "serve"], 1000, 2.0, 1.0)
    fp.add(11, 10, "tritonserver", ["/opt/tritonserver/bin/tritonserver", "--model-repository=/r"], 20_000, 1.0)
    fp.add(12, 11, "triton_python_b", [STUB, "/r/piper/1/model.py", "shm-a", "1", "11"], 300_000, 5.0)
    fp.add(13, 12, "EngineCore (x)", ["python", "-c", "engine"], 500_000, 3.0)
    fp.add(14, 11, "triton_python_b", [STUB, "/r/csm_talker/1/model.py", "shm-b", "1", "11"], 100_000)
    fp.add(15, 11, "triton_python_b", [STUB, "/r/csm_talker/1/model.py", "shm-c", "1", "11"], 100_001)
    fp.add(16, 10, "python", ["python", "-m", "openai_frontend", "--triton-url", "x", "--port", "9123"], 80_000)
    fp.add(17, 16, "python", ["python", "-c", "worker"], 4096)
    fp.add(18, 10, "sleep", ["sleep", "1"], None)
    return fp


def test_stack_processes_groups_each_stub_with_its_descendants(fake_proc):
    groups = {p.pid: p.group for p in bf.stack_processes(10)}
    assert groups == {10: "serve", 11: "tritonserver", 12: "model:piper", 13: "model:piper",
                      14: "model:csm_talker", 15: "model:csm_talker", 16: "frontend", 17: "frontend",
                      18: "other"}


def test_memory_table_sums_pss_per_model_and_part_rounding_up(fake_proc):
    table = bf.memory_table(bf.stack_processes(10))
    assert table["models"]["piper"] == {"pss_mib": 782, "processes": 2, "pids": [12, 13]}  # 800000 KiB
    assert table["models"]["csm_talker"]["pss_mib"] == 196  # 200001 KiB = 195.3 MiB, rounded up
    assert table["parts"]["frontend"]["pss_mib"] == 83 and table["parts"]["frontend"]["processes"] == 2
    assert table["parts"]["serve"]["pss_mib"] == 1 and table["parts"]["tritonserver"]["pss_mib"] == 20
    assert table["unreadable_pids"] == [18]  # no smaps_rollup: counted 0 and named
    assert table["total_pss_mib"] == bf.kib_to_mib(1000 + 20_000 + 800_000 + 200_001 + 84_096)
    assert table["processes"] == 9


def test_attach_info_reads_the_frontend_port(fake_proc):
    assert bf.attach_info(10) == {"url": "http://127.0.0.1:9123"}


def test_cpu_deltas_over_an_interval(fake_proc):
    before = bf.stack_processes(10)
    fake_proc.add(12, 11, "triton_python_b", [STUB, "/r/piper/1/model.py", "shm-a", "1", "11"], 300_000, 5.5, 0.1)
    fake_proc.add(10, 1, "omni-triton", ["python", "-m", "omni_triton", "serve"], 1000, 2.2, 1.1)
    # 15 restarted (another start time: another process), 19 is new
    fake_proc.add(15, 11, "triton_python_b", [STUB, "/r/csm_talker/1/model.py", "shm-c", "1", "11"], 1, 9.0,
                  start_ticks=9000)
    fake_proc.add(19, 11, "triton_python_b", [STUB, "/r/llm/1/model.py", "shm-d", "1", "11"], 1, 1.0)
    after = bf.stack_processes(10)
    d = bf.cpu_deltas(before, after, 10.0)
    assert d["groups"]["model:piper"] == pytest.approx(6.0)  # 0.6 s over 10 s
    assert d["groups"]["serve"] == pytest.approx(3.0)
    assert d["total_core_pct"] == pytest.approx(9.0)
    assert d["processes"][0]["pid"] == 12 and d["processes"][0]["cpu_s"] == pytest.approx(0.6)
    assert d["started"] == [15, 19] and d["ended"] == [15]
    with pytest.raises(ValueError):
        bf.cpu_deltas(before, after, 0)


def test_set_pss_mib_appends_then_replaces_its_own_block():
    text = 'name: "m"\nbackend: "python"\nparameters: { key: "x" value: { string_value: "1" } }\n'
    once = bf.set_pss_mib(text, 120, "on 2026-12-03 on a CPU")
    assert once.startswith(text) and 'key: "pss_mib" value: { string_value: "120" }' in once
    twice = bf.set_pss_mib(once, 7, "on 2026-12-04 on another CPU")
    assert twice.count("pss_mib") == once.count("pss_mib")
    assert '"7"' in twice and '"120"' not in twice and "2026-12-03" not in twice
    assert bf.model_pss_mib_of(twice) == 7
    for bad in (0, -3, 1.5):
        with pytest.raises(ValueError):
            bf.set_pss_mib(text, bad, "x")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="outside a block"):
        bf.set_pss_mib(text + 'parameters: { key: "pss_mib" value: { string_value: "3" } }\n', 5, "x")


def test_write_pss_mib_writes_only_known_models(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "config.pbtxt").write_text('name: "a"\n')
    written = bf.write_pss_mib({"a": {"pss_mib": 3}, "ghost": {"pss_mib": 4}}, {"a": tmp_path / "a"}, "note")
    assert written == ["a"]
    assert bf.model_pss_mib_of((tmp_path / "a" / "config.pbtxt").read_text()) == 3


def test_report_has_every_section_key():
    args = argparse.Namespace(models="piper,csm")
    doc = bf.report(args, stack={"total_pss_mib": 1}, idle_cpu=None)
    assert {"bench", "commit", "measured_at", "machine", "versions", "pipelines", "notes", "stack",
            "idle_cpu", "load", "first_request", "fresh_clone", "pss_mib_written"} <= doc.keys()
    assert doc["pipelines"] == ["piper", "csm"] and doc["load"] is None and doc["bench"] == "footprint"


def test_pipeline_closure_has_dependencies_first_and_companions():
    closure = bf.pipeline_closure("qwen3_tts")
    assert closure[-1] == "qwen3_tts" or "qwen3_tts_voice_prompt" in closure
    assert "qwen3_tts_voice_prompt" in closure
    assert closure.index("csm_talker") < closure.index("csm") if "csm" in closure else True
    llm_tts = bf.pipeline_closure("llm_tts")
    assert {"llm", "piper"} <= set(llm_tts) and llm_tts.index("llm") < llm_tts.index("llm_tts")


def test_serve_command_passes_the_ready_timeout_and_ports():
    """serve's own --ready-timeout (600 s) ended the first full-stack run of this bench here."""
    ports = {"frontend": 1, "http": 2, "grpc": 3, "metrics": 4}
    cmd = bf.serve_command("piper", ports, python="py", ready_timeout_s=1800)
    assert cmd[:5] == ["py", "-m", "omni_triton", "serve", "--skip-prepare"]
    assert cmd[cmd.index("--ready-timeout") + 1] == "1800"
    assert [cmd[cmd.index(f) + 1] for f in ("--port", "--triton-http-port", "--triton-grpc-port",
                                            "--triton-metrics-port")] == ["1", "2", "3", "4"]
    assert "--skip-prepare" not in bf.serve_args("piper", ports)  # serve.sh passes it itself


def test_every_model_config_has_a_positive_pss_mib():
    """The memory budget of on-demand loading (issue 28 item 2) sums pss_mib: a new stage
    without one would count as free. Write them with `python -m clients.bench_footprint
    --write-pss-mib` (docs/benchmarks.md "Footprint")."""
    configs = sorted((ROOT / "model_repository").glob("*/config.pbtxt"))
    assert configs
    missing = [c.parent.name for c in configs if not (bf.model_pss_mib_of(c.read_text()) or 0) >= 1]
    assert not missing, f"config.pbtxt without a positive integer pss_mib parameter: {missing}"


def test_on_demand_state_reads_the_frontends_model_list(monkeypatch):
    class R:
        def __init__(self, data):
            self.data = data

        def json(self):
            return {"data": self.data}

    listed = [{"id": "llm", "state": "unloaded"}, {"id": "piper_tts"}]
    monkeypatch.setattr(bf.httpx, "get", lambda url, timeout: R(listed))
    assert bf.on_demand_state("http://x", "llm") == "unloaded"
    assert bf.on_demand_state("http://x", "piper_tts") is None  # listed without a state: no on-demand
    assert bf.on_demand_state("http://x", "ghost") is None
