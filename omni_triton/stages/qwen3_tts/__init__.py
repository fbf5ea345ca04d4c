"""Qwen3-TTS (the ``qwen3_tts`` family): talker, codec and clone prompts on the official ``qwen-tts``
package. ``request`` and ``streaming`` import in any environment; ``engine`` and ``scheduler`` need the
Qwen3-TTS environment (``.venv-qwen3-tts``, docs/qwen3_tts.md), so this package imports none of its
modules itself: import them by name (``omni_triton.stages.qwen3_tts.engine``)."""
