"""Qwen2.5-Omni pipeline (thinker -> talker -> token2wav) as separable stages, no Triton.

Architecture (transformers 5.19 ``Qwen2_5OmniForConditionalGeneration``, model type ``qwen2_5_omni``;
Qwen2.5-Omni technical report, arXiv:2503.20215):

- **thinker** (``model.thinker``, a Qwen2.5 decoder LM with audio/vision encoders) generates the
  text answer. The talker is conditioned, per token, on the thinker's input embedding
  (``hidden_states[0]``) *plus* its last-layer hidden state (``hidden_states[-1]``);
- **talker** (``model.talker``, a decoder over one codebook of 8192 codec ids at 50 per second)
  generates the codec tokens; its prompt is the prompt's thinker states, the voice's text bos
  embedding and the first answer token, and it consumes one answer-token state per step
  (``thinker_reply_part``), then the thinker's embeddings of ``tts_text_end`` / ``tts_text_pad``;
- **token2wav** (``model.token2wav``): a DiT (flow matching, RK4 ODE over ``num_steps`` 10 with
  classifier-free guidance 0.5, conditioned on the voice's ``cond`` vector and reference mel from
  ``spk_dict.pt``) turns the codes into a mel spectrogram (2 mel frames per code), BigVGAN turns
  the mel into 24 kHz PCM (240 samples per mel frame: 480 samples per code).

The stages reproduce ``Qwen2_5OmniForConditionalGeneration.generate(..., return_audio=True)``:
:class:`Qwen25Thinker` is the Qwen3-Omni :class:`~omni_triton.stages.qwen3_omni.OmniThinker` (the
same streaming ``thinker.generate``) reading the last layer as its "accept layer";
:func:`build_talker_inputs` rebuilds the talker's inputs as the reference's ``generate`` does;
:class:`Qwen25Talker` runs ``model.talker.generate`` with the reference's arguments and streams
each codec token; :class:`Qwen25Token2Wav` runs ``model.token2wav`` on the whole utterance with
its noise drawn after ``torch.manual_seed(seed)`` (why whole-utterance: ``docs/qwen2_5_omni.md``).

Data contract between the stages (the Triton tensors, ``docs/qwen2_5_omni.md``): the thinker's
:class:`~omni_triton.stages.qwen3_omni.ThinkerOutput` exactly as Qwen3-Omni's (``sequence`` int64
[L], ``prompt_len``, ``embeds`` float32 [L-1, H], ``hidden`` float32 [L-1, H] = last layer,
``tts_embeds`` float32 [3, H] = thinker embeddings of ``tts_text_start``/``end``/``pad``);
talker -> token2wav: codec ids int64 [T] (streamed as [n, 1]); token2wav -> client: float32 mono
PCM in [-1, 1] at 24 kHz, ``480 * T`` samples.

Layout: ``thinker``, ``talker``, ``token2wav``, ``pipeline`` (in-process); the tiny checkpoint
builder is ``omni_triton.checkpoints.qwen2_5_omni``.
"""
from omni_triton.stages.qwen2_5_omni.pipeline import run_pipeline  # noqa: F401
from omni_triton.stages.qwen2_5_omni.talker import (  # noqa: F401
    Qwen25Talker,
    TalkerSettings,
    build_talker_inputs,
    talker_generate_kwargs,
)
from omni_triton.stages.qwen2_5_omni.thinker import Qwen25Thinker, chat_tokenizer, load_model  # noqa: F401
from omni_triton.stages.qwen2_5_omni.token2wav import Qwen25Token2Wav  # noqa: F401
