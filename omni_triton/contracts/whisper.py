"""The ``whisper`` family's stage tensors (the client-facing ``whisper`` BLS takes the ASR contract,
``omni_triton.contracts.asr``): ``whisper_encoder`` (dynamically batched: one segment's AUDIO ->
the encoder's last hidden state) and ``whisper_decoder`` (decoupled: encoder states + language /
task / prompt -> one response per generated token, its TOKENS and TEXT_DELTA, continuous batching
across requests inside the stage). docs/asr.md describes both."""
from __future__ import annotations

from omni_triton.contracts.asr import ASR, LANGUAGE, PROMPT, TASK, TEXT_DELTA
from omni_triton.contracts.tensors import AUDIO, REQUEST_ID, StageContract, TensorSpec

#: FP32 [source_positions, d_model]: the encoder's last hidden state of one 30 s window (1500 x d_model)
ENCODER_HIDDEN = "ENCODER_HIDDEN"
#: INT32 [1], optional: most tokens to generate (``<|endoftext|>`` counted); default the checkpoint's
#: generation config ``max_new_tokens``
MAX_NEW_TOKENS = "MAX_NEW_TOKENS"
#: INT64 [-1]: the token ids generated since the previous response (one per response)
TOKENS = "TOKENS"

WHISPER_ENCODER = StageContract((TensorSpec(AUDIO, "FP32", (-1,)),), (TensorSpec(ENCODER_HIDDEN, "FP32", (-1, -1)),),
                                batched=True)
WHISPER_DECODER = StageContract(
    (TensorSpec(ENCODER_HIDDEN, "FP32", (-1, -1)), TensorSpec(LANGUAGE, "BYTES", optional=True),
     TensorSpec(PROMPT, "BYTES", optional=True), TensorSpec(TASK, "BYTES", optional=True),
     TensorSpec(MAX_NEW_TOKENS, "INT32", optional=True), TensorSpec(REQUEST_ID, "BYTES", optional=True)),
    (TensorSpec(TOKENS, "INT64", (-1,)), TensorSpec(TEXT_DELTA, "BYTES")), decoupled=True)

CONTRACTS = {"whisper_encoder": WHISPER_ENCODER, "whisper_decoder": WHISPER_DECODER}
#: the BLS's own contract is the ASR one (listed here too so the family's three models are in one place)
BLS = {"whisper": ASR}
