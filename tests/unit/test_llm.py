"""Unit tests of the llm stage library (omni_triton.stages.llm), without Triton.

The tokenizer tests use the real SmolLM2 folder that ``omni-triton prepare`` builds (built here if
missing, ~20 s once); the vLLM engine itself is exercised end to end in tests/e2e/test_llm_stage.py.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import psutil
import pytest

from omni_triton.checkpoints.llm import build_smollm2
from omni_triton.contracts.chat import ChatInputError, parse_messages, parse_modalities, parse_sampling
from omni_triton.paths import model_dir
from omni_triton.runtime.reaper import ChildReaper
from omni_triton.stages.llm import (
    SentenceSegmenter,
    SentenceSpeaker,
    build_generation_job,
    make_sampling_params,
    parse_engine_config,
    speakable,
)

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def smollm2() -> Path:
    return build_smollm2(model_dir("smollm2"), log=lambda _m: None)


@pytest.fixture(scope="module")
def tokenizer(smollm2):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2)


# ------------------------------------------------------------------ prepare (GGUF -> HF folder)


def test_smollm2_folder_is_a_bf16_llama_with_chat_template(smollm2):
    config = json.loads((smollm2 / "config.json").read_text())
    assert config["model_type"] == "llama" and config["num_hidden_layers"] == 30
    assert config["dtype"] == "bfloat16"
    assert "<|im_start|>" in (smollm2 / "chat_template.jinja").read_text()
    before = (smollm2 / "model.safetensors").stat().st_mtime
    build_smollm2(smollm2, log=lambda _m: None)  # idempotent: a finished folder is left alone
    assert (smollm2 / "model.safetensors").stat().st_mtime == before


def test_dequantized_weights_answer_greedily(smollm2, tokenizer):
    """The dequantized checkpoint is the real model: transformers greedy answers 'Paris'."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.bfloat16)
    ids = tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True, return_tensors="pt",
                                        return_dict=True)["input_ids"]
    out = model.generate(ids, max_new_tokens=10, do_sample=False)
    assert "Paris" in tokenizer.decode(out[0, ids.shape[1]:])


# ------------------------------------------------------------------ engine configuration


def test_engine_config_resolves_model_in_cache(tmp_path):
    params = {"engine_args": json.dumps({"model": "smollm2", "dtype": "bfloat16", "max_model_len": 2048}),
              "engine_env": json.dumps({"VLLM_CPU_KVCACHE_SPACE": 1}), "max_model_len": "2048"}
    config = parse_engine_config(params, tmp_path)
    assert config.engine_args["model"] == str(tmp_path / "smollm2")
    assert config.env == {"VLLM_CPU_KVCACHE_SPACE": "1"}
    assert config.max_model_len == 2048 and config.default_max_tokens == 512
    absolute = parse_engine_config({"engine_args": json.dumps({"model": "/m", "max_model_len": 64})}, tmp_path)
    assert absolute.engine_args["model"] == "/m"


def test_engine_config_real_model_config_parses():
    """The shipped model_repository/llm/config.pbtxt parameters are valid engine arguments."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    from omni_triton.serve.repository import available_models, model_parameters

    config = parse_engine_config(model_parameters(available_models()["llm"]), Path("/models"))
    args = AsyncEngineArgs(**config.engine_args)
    assert args.enforce_eager and args.dtype == "bfloat16" and args.max_model_len == 2048
    assert config.env["VLLM_CPU_KVCACHE_SPACE"]


@pytest.mark.parametrize("params, match", [
    ({}, "engine_args"),
    ({"engine_args": "{"}, "not valid JSON"),
    ({"engine_args": '{"dtype": "bfloat16"}'}, "model"),
    ({"engine_args": '{"model": "m"}'}, "max_model_len"),
    ({"engine_args": '{"model": "m", "max_model_len": 2048}', "max_model_len": "4096"}, "differs"),
    ({"engine_args": '{"model": "m", "max_model_len": 8}', "engine_env": "[1]"}, "engine_env"),
])
def test_engine_config_errors(params, match, tmp_path):
    with pytest.raises(ValueError, match=match):
        parse_engine_config(params, tmp_path)


# ------------------------------------------------------------------ request validation


def test_messages_text_parts_and_developer_role():
    messages = parse_messages(json.dumps([
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}],
         "name": "ann"},
        {"role": "assistant", "content": None},
    ]))
    assert messages == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"},
                        {"role": "assistant", "content": ""}]


@pytest.mark.parametrize("text, match", [
    ("[]", "non-empty"),
    ("{}", "non-empty"),
    ("not json", "not valid JSON"),
    ('[{"role": "wizard", "content": "x"}]', "role 'wizard'"),
    ('[{"role": "tool", "content": "x"}]', "role 'tool'"),
    ('[{"content": "x"}]', "role None"),
    ('[{"role": "user", "content": 3}]', "string or a list"),
    ('[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]', "does not accept image_url parts"),
    ('[{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]',
     "does not accept input_audio parts"),
    ('[{"role": "user", "content": [{"type": "file", "file": {}}]}]', "only text parts"),
    ('["hello"]', "must be an object"),
])
def test_bad_messages(text, match):
    with pytest.raises(ChatInputError, match=match):
        parse_messages(text)


def test_sampling_parameters_ok():
    assert parse_sampling(None) == {}
    params = parse_sampling(json.dumps({"temperature": 0, "top_p": 0.9, "max_tokens": 16,
                                                   "stop": "\n", "seed": 1, "ignore_eos": True,
                                                   "top_k": None}))
    assert params == {"temperature": 0, "top_p": 0.9, "max_tokens": 16, "stop": ["\n"], "seed": 1,
                      "ignore_eos": True}
    sp = make_sampling_params(params)
    from vllm.sampling_params import RequestOutputKind

    assert sp.output_kind == RequestOutputKind.DELTA and sp.max_tokens == 16 and sp.stop == ["\n"]


@pytest.mark.parametrize("params, match", [
    ('"x"', "JSON object"),
    ("{", "not valid JSON"),
    ('{"best_of": 2}', "unknown sampling parameter"),
    ('{"max_tokens": "10"}', "wrong type"),
    ('{"max_tokens": 1.5}', "wrong type"),
    ('{"max_tokens": true}', "wrong type"),
    ('{"ignore_eos": 1}', "wrong type"),
    ('{"stop": ["a", 1]}', "list of strings"),
    ('{"temperature": -0.5}', "outside"),
    ('{"top_p": 0}', "outside"),
    ('{"top_p": 1.5}', "outside"),
    ('{"top_k": -2}', "outside"),
    ('{"max_tokens": 0}', "outside"),
    ('{"max_tokens": -1}', "outside"),
    ('{"min_tokens": 5, "max_tokens": 2}', "min_tokens"),
    ('{"presence_penalty": 3}', "outside"),
    ('{"repetition_penalty": 0}', "outside"),
])
def test_bad_sampling_parameters(params, match):
    with pytest.raises(ChatInputError, match=match):
        parse_sampling(params)


def test_vllm_rejections_are_input_errors():
    with pytest.raises(ChatInputError, match="temperature"):
        make_sampling_params({"temperature": -1.0})


def test_chat_template_and_token_counts(tokenizer):
    job = build_generation_job("r1", tokenizer, None, json.dumps(QUESTION), '{"temperature": 0}', 2048, 512)
    text = tokenizer.decode(job.prompt_ids)
    # SmolLM2's ChatML template, with its default system prompt and the generation prompt
    assert text.startswith("<|im_start|>system\n")
    assert text.endswith("<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n")
    assert text.count("<|im_start|>") == 3  # no special token added twice
    assert job.sampling == {"temperature": 0, "max_tokens": 512}
    system = build_generation_job("r2", tokenizer, None,
                                  json.dumps([{"role": "system", "content": "Be brief."}] + QUESTION),
                                  None, 2048, 512)
    assert "helpful AI assistant" not in tokenizer.decode(system.prompt_ids)


def test_raw_prompt_and_max_tokens_default(tokenizer):
    job = build_generation_job("r", tokenizer, "The capital of France is", None, None, 64, 512)
    assert tokenizer.decode(job.prompt_ids) == "The capital of France is"
    assert job.sampling["max_tokens"] == 64 - len(job.prompt_ids)  # capped by the context


@pytest.mark.parametrize("prompt, messages, sampling, match", [
    ("hi", json.dumps(QUESTION), None, "exactly one"),
    (None, None, None, "exactly one"),
    ("", None, None, "empty"),
    ("word " * 3000, None, None, "context"),
    ("hi", None, '{"max_tokens": 2048}', "exceeds"),
    (None, "[]", None, "non-empty"),
    ("hi", None, '{"temperature": -1}', "outside"),
])
def test_bad_requests(tokenizer, prompt, messages, sampling, match):
    with pytest.raises(ChatInputError, match=match):
        build_generation_job("r", tokenizer, prompt, messages, sampling, 2048, 512)


def test_modalities():
    assert parse_modalities(None) == ["text"]
    assert parse_modalities('["text", "audio", "text"]') == ["text", "audio"]
    assert parse_modalities(None, default=("text", "audio")) == ["text", "audio"]
    for bad in ('[]', '["video"]', '"audio"', "{", "[1]"):
        with pytest.raises(ChatInputError):
            parse_modalities(bad)


# ------------------------------------------------------------------ sentence segmentation

ANSWER = ('The capital of France is Paris. It is known as "the City of Light." Dr. Smith, e.g. a '
          'visitor, paid 3.50 euros! Is it big? Yes:\n1. The Louvre\n2. The Eiffel Tower\nThe end')
SENTENCES = ['The capital of France is Paris.', 'It is known as "the City of Light."',
             'Dr. Smith, e.g. a visitor, paid 3.50 euros!', 'Is it big? Yes:', '1. The Louvre',
             '2. The Eiffel Tower', 'The end']


@pytest.mark.parametrize("step", [1, 2, 3, 7, len(ANSWER)])
def test_segmenter_streaming_equals_whole(step):
    seg = SentenceSegmenter()
    out = []
    for i in range(0, len(ANSWER), step):
        out += seg.push(ANSWER[i:i + step])
    assert out + seg.flush() == SENTENCES


def test_segmenter_emits_as_soon_as_complete():
    seg = SentenceSegmenter()
    assert seg.push("The capital of France is Paris.") == []  # "Paris.com"? wait for what follows
    assert seg.push(" It") == ["The capital of France is Paris."]
    assert seg.push(" is 3.") == []
    assert seg.push("14 wide.") == []
    assert seg.flush() == ["It is 3.14 wide."]
    assert seg.flush() == []


def test_segmenter_joins_short_pieces_and_cuts_run_on_text():
    seg = SentenceSegmenter(min_chars=12)
    assert seg.push("Yes. No. That is all. ") == ["Yes. No. That is all."]
    seg = SentenceSegmenter(max_chars=40)
    words = " ".join(["word"] * 30)
    pieces = seg.push(words) + seg.flush()
    assert all(len(p) <= 40 for p in pieces) and " ".join(pieces) == words


def test_speakable():
    assert speakable("**Paris** is `big`.") == "Paris is big ."
    assert speakable("...") is None and speakable(" * ") is None
    assert speakable("# 1.") == "1."


# ------------------------------------------------------------------ sentence speaker (fake TTS side)


def test_speaker_speaks_each_sentence_as_soon_as_it_is_complete():
    spoken = []

    def synthesize(sentence):  # fake TTS: one chunk per word, value = sentence index
        spoken.append(sentence)
        for _ in sentence.split():
            yield np.full(4, len(spoken), dtype=np.float32)

    speaker = SentenceSpeaker(synthesize)
    first = list(speaker.push_text("The capital of France is Paris. It is"))
    assert spoken == ["The capital of France is Paris."], "spoken before the text ends"
    assert [int(a[0]) for a in first] == [1] * 6
    rest = list(speaker.push_text(" very big. **Really** big")) + list(speaker.finish())
    assert spoken == ["The capital of France is Paris.", "It is very big.", "Really big"]
    assert [int(a[0]) for a in rest] == [2] * 4 + [3] * 2
    assert speaker.sentences == spoken


def test_speaker_runs_on_the_callers_thread():
    """Two threads of one stub reading BLS streams deadlock python_backend: the speaker must not
    start one (omni_triton/adapters/bls.py, "One thread")."""
    threads = set()

    def synthesize(sentence):
        threads.add(threading.get_ident())
        yield np.ones(4, np.float32)

    speaker = SentenceSpeaker(synthesize)
    before = threading.active_count()
    chunks = list(speaker.push_text("One sentence is here. ")) + list(speaker.finish())
    assert len(chunks) == 1 and threads == {threading.get_ident()} and threading.active_count() == before


def test_speaker_stopping_early_closes_the_synthesis():
    closed = []

    def synthesize(sentence):
        try:
            yield np.ones(4, np.float32)
            yield np.ones(4, np.float32)
        finally:
            closed.append(sentence)  # stream_stage drains its BLS stream here

    chunks = SentenceSpeaker(synthesize).push_text("First sentence here. Second sentence here. ")
    next(chunks)
    chunks.close()  # the request was cancelled after the first chunk
    assert closed == ["First sentence here."]


def test_speaker_reports_tts_failure():
    def synthesize(sentence):
        raise RuntimeError("piper down")
        yield  # pragma: no cover

    speaker = SentenceSpeaker(synthesize)
    with pytest.raises(RuntimeError, match="piper down"):
        list(speaker.push_text("One sentence is here. "))


# ------------------------------------------------------------------ child reaper

_TREE = textwrap.dedent("""
    import signal, subprocess, sys, time
    # a child that ignores SIGTERM (like multiprocessing's resource tracker) and one that does not
    stubborn = subprocess.Popen([sys.executable, "-c",
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(600)"],
        stdout=subprocess.PIPE)
    stubborn.stdout.readline()
    plain = subprocess.Popen(["sleep", "600"])
    print(stubborn.pid, plain.pid, flush=True)
    time.sleep(600)
""")


def test_reaper_kills_descendants_even_stubborn_ones():
    parent = subprocess.Popen([sys.executable, "-c", _TREE], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in parent.stdout.readline().split()]
        reaper = ChildReaper(parent.pid)
        assert sorted(reaper.snapshot()) == sorted(pids)
        reaper.reap(timeout=0.5)
        for pid in pids:
            assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    finally:
        parent.kill()
        parent.wait()


_WATCHED = textwrap.dedent("""
    import os, subprocess, sys, time
    from omni_triton.runtime.reaper import ChildReaper
    server_pid = int(sys.argv[1])
    engine = subprocess.Popen(["sleep", "600"])   # stands for the EngineCore child of a stub
    reaper = ChildReaper()
    reaper.watch(server_pid, on_gone=lambda: os._exit(0), interval_s=0.1)
    print(engine.pid, flush=True)
    time.sleep(600)
""")
_SERVER = textwrap.dedent("""
    import subprocess, sys, time
    stub = subprocess.Popen([sys.executable, "-c", sys.argv[1], "0"], stdout=subprocess.PIPE, text=True)
    print(stub.pid, stub.stdout.readline().strip(), flush=True)
    time.sleep(600)
""")


def test_watch_reaps_engine_when_server_dies():
    """A 'server' process starts a 'stub' that starts an 'engine' child; SIGKILL the server: the
    stub's watcher kills the engine and the stub exits (nothing outlives the server)."""
    stub_code = _WATCHED.replace("int(sys.argv[1])", "os.getppid()")
    server = subprocess.Popen([sys.executable, "-c", _SERVER, stub_code], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    stub_pid, engine_pid = (int(x) for x in server.stdout.readline().split())
    assert psutil.pid_exists(engine_pid)
    server.send_signal(signal.SIGKILL)
    server.wait()
    procs = [psutil.Process(p) for p in (stub_pid, engine_pid) if psutil.pid_exists(p)]
    _, alive = psutil.wait_procs(procs, timeout=20)
    for p in alive:
        p.kill()
    assert not alive, f"left behind: {alive}"


def test_engine_watch_fires_once_when_vllm_reports_the_engine_dead():
    """The llm stage leaves (so serve reloads it) when vLLM's AsyncLLM turns ``errored``."""
    import threading
    from types import SimpleNamespace

    from omni_triton.runtime.vllm_runner import AsyncEngineRunner

    runner = object.__new__(AsyncEngineRunner)  # no engine start: only the watch is under test
    runner.engine = SimpleNamespace(errored=False)
    fired = threading.Event()
    thread = runner.watch_engine(fired.set, interval_s=0.01)
    assert not fired.wait(0.1) and not runner.engine_dead
    runner.engine.errored = True
    assert fired.wait(5) and runner.engine_dead
    thread.join(5)
    assert not thread.is_alive()
