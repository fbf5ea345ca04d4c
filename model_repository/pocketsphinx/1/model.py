"""Triton binding: CMU PocketSphinx US-English ASR (decoupled): AUDIO -> one text delta per utterance.
Adapter: omni_triton.adapters.pocketsphinx.PocketsphinxStage; contract: omni_triton.contracts."""
import locale

locale.setlocale(locale.LC_CTYPE, "")  # the stub starts with an ASCII text encoding

from omni_triton.adapters.pocketsphinx import PocketsphinxStage as TritonPythonModel  # noqa: E402,F401
