"""The ASR contract's request side shared by every speech-recognition model (``whisper``,
``pocketsphinx``): its config parameters and the request parser (``omni_triton.contracts.asr``)."""
from __future__ import annotations

from omni_triton.adapters.triton_io import optional_str_input, required_array
from omni_triton.contracts import asr
from omni_triton.contracts.tensors import AUDIO


class AsrParams:
    """The ASR contract's config parameters (``languages``, ``supports_translation``,
    ``max_audio_s``) and the request parser that uses them."""

    def read_asr_params(self, params: dict[str, str]) -> None:
        """Read the parameters.

        Raises:
            ValueError: ``max_audio_s`` is not a positive number (a load error).
        """
        self.languages = [c.strip().lower() for c in params.get("languages", "en").split(",") if c.strip()]
        self.supports_translation = params.get("supports_translation", "false").strip().lower() == "true"
        self.max_audio_s = float(params.get("max_audio_s", "30"))
        if not self.max_audio_s > 0:
            raise ValueError(f"max_audio_s must be > 0, got {self.max_audio_s}")

    def parse_asr(self, request) -> asr.ASRRequest:
        """The request's validated ASR inputs (``asr.parse_asr_request``).

        Raises:
            asr.ASRInputError: see ``parse_asr_request``.
        """
        audio = required_array(request, AUDIO)
        return asr.parse_asr_request(
            audio, optional_str_input(request, asr.LANGUAGE, 16, asr.ASRInputError),
            optional_str_input(request, asr.PROMPT, asr.MAX_PROMPT_CHARS, asr.ASRInputError),
            optional_str_input(request, asr.TASK, 16, asr.ASRInputError),
            languages=self.languages, supports_translation=self.supports_translation, max_audio_s=self.max_audio_s)
