"""Parity reference for tests/e2e/test_qwen3_tts_served.py, run with the Qwen3-TTS environment's
interpreter (``.venv-qwen3-tts/bin/python``; qwen-tts needs transformers 4.57.3, the test process
has 5.x): the package's own non-streaming ``generate_custom_voice`` / ``generate_voice_design`` /
``generate_voice_clone`` (+ its decode) on the prepared tiny checkpoint, greedy (the checkpoint's
generation_config.json), nothing of the project's generation code.

Usage: ``python tests/e2e/qwen3_tts_reference.py CHECKPOINT_DIR IN.json OUT.npz``; IN.json is a
list of ``{"task", "text", "language", "speaker", "instructions", "ref_audio_npy", "ref_sr",
"ref_text", "max_new_tokens"}``; OUT.npz holds ``audio_<i>`` float32 PCM at 24 kHz and
``codes_<i>`` the talker's codec codes, int64 ``[frames, num_code_groups]``: the first value that
the package's ``Qwen3TTSModel.model.generate`` returns inside ``generate_*`` (for a clone, the
generated frames only; the package prepends the reference clip's codes for the decode alone).
"""
import json
import sys

import numpy as np
import torch

torch.set_num_threads(1)
from qwen_tts import Qwen3TTSModel  # noqa: E402

root, src, dst = sys.argv[1:4]
models, out = {}, {}
for i, r in enumerate(json.load(open(src))):
    task = r["task"]
    if task not in models:
        models[task] = Qwen3TTSModel.from_pretrained(f"{root}/{task}")
    m = models[task]
    generate, seen = m.model.generate, []

    def recording(*args, _generate=generate, _seen=seen, **kwargs):
        codes_list, rest = _generate(*args, **kwargs)
        _seen.append(codes_list)
        return codes_list, rest

    m.model.generate = recording  # the package's own call, only observed
    kw = dict(language=r.get("language") or "Auto", max_new_tokens=r["max_new_tokens"])
    if task == "custom_voice":
        wavs, sr = m.generate_custom_voice(r["text"], speaker=r["speaker"], instruct=r.get("instructions"), **kw)
    elif task == "voice_design":
        wavs, sr = m.generate_voice_design(r["text"], instruct=r["instructions"], **kw)
    else:
        ref = (np.load(r["ref_audio_npy"]).astype(np.float32), int(r["ref_sr"]))
        wavs, sr = m.generate_voice_clone(r["text"], ref_audio=ref, ref_text=r.get("ref_text"), **kw)
    assert sr == 24000 and len(seen) == 1 and len(seen[0]) == 1
    m.model.generate = generate
    out[f"codes_{i}"] = seen[0][0].detach().cpu().numpy().astype(np.int64)
    out[f"audio_{i}"] = np.asarray(wavs[0], np.float32)
np.savez(dst, **out)
