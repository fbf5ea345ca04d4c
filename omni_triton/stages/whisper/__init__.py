"""Whisper speech recognition (the ``whisper`` family): ``encoder`` (16 kHz PCM -> Whisper's log-mel
features -> the encoder's last hidden state, several requests in one forward pass) and ``decoder``
(greedy autoregressive decoding with a KV cache, requests joining and leaving one shared batch:
continuous batching like the Qwen3-TTS talker's ``TalkerScheduler``), both on transformers'
``WhisperForConditionalGeneration`` loaded with ``from_pretrained`` (the tiny random checkpoint of
``omni_triton.checkpoints.whisper`` here, ``openai/whisper-*`` the same way).

Parity: the tokens are those of ``model.generate(input_features, language=..., task=...,
prompt_ids=...)`` (greedy): the same decoder prompt (``[<|startofprev|> prompt...] <|startoftranscript|>
<|lang|> <|task|> <|notimestamps|>``), the same language detection when no language is given
(argmax over the language tokens after ``<|startoftranscript|>``), the same suppressed tokens
(``suppress_tokens`` always, ``begin_suppress_tokens`` at the first position) and the same stop
(``<|endoftext|>`` or ``max_new_tokens``). Tested in ``tests/unit/test_whisper.py`` (alone and batched).

Imports torch lazily: import the modules by name (``omni_triton.stages.whisper.encoder``,
``omni_triton.stages.whisper.decoder``).
"""
