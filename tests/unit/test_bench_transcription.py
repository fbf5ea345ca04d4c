"""clients.bench_transcription: its pure parts (WER normalisation, per-level aggregation, ratios,
the table) and the pocketsphinx baseline on a Piper clip. No timing asserts."""
from __future__ import annotations

import pytest

from clients import bench_transcription as b


def test_normalize_drops_case_punctuation_and_extra_spaces():
    assert b.normalize("  The capital,  of France is PARIS. ") == "the capital of france is paris"


def test_word_error_rate_counts_substitutions_deletions_insertions_over_all_pairs():
    refs = ["The capital of France is Paris.", "How much does this ticket cost?"]
    assert b.word_error_rate(refs, ["the capital of france is paris", "how much does this ticket cost"]) == 0.0
    # 1 substitution (paris -> paws) + 1 deletion (cost) over 12 reference words
    assert b.word_error_rate(refs, ["the capital of france is paws", "how much does this ticket"]) == \
        pytest.approx(2 / 12, abs=1e-4)
    assert b.word_error_rate(["one two"], [""]) == 1.0  # nothing heard: every word deleted
    assert b.word_error_rate([], []) is None
    with pytest.raises(ValueError):
        b.word_error_rate(["a"], [])


def _result(i, latency, audio=2.0, text="the capital of france is paris", error=None):
    return b.TranscriptionResult(i, "The capital of France is Paris.", audio, latency, text if error is None else None,
                                 error)


def test_summarize_rtf_throughput_wer_and_errors():
    results = [_result(0, 0.5), _result(1, 1.0, audio=4.0, text="the capital of france is"),
               _result(2, None, error="APIConnectionError: boom")]
    s = b.summarize(results, wall_s=2.0)
    assert (s["requests"], s["ok"], s["errors"]) == (3, 2, 1)
    assert s["error_messages"] == ["APIConnectionError: boom"]
    assert s["latency_ms"]["p50"] == 750.0 and s["latency_ms"]["max"] == 1000.0
    assert s["rtf_mean"] == pytest.approx((0.25 + 0.25) / 2)
    assert s["audio_s_total"] == 6.0 and s["throughput_audio_s_per_s"] == 3.0 and s["requests_per_s"] == 1.0
    assert s["wer"] == pytest.approx(1 / 12, abs=1e-4)  # one deletion over 2 x 6 words
    empty = b.summarize([_result(0, None, error="x")], wall_s=1.0)
    assert empty["ok"] == 0 and empty["rtf_mean"] is None and empty["wer"] is None
    assert empty["throughput_audio_s_per_s"] is None


def test_ratios_compare_served_with_inprocess_per_level():
    served = b.summarize([_result(0, 1.0)], 1.0)
    base = b.summarize([_result(0, 0.5)], 0.5)
    ratios = b.all_ratios({"pocketsphinx": {"served": {"1": served}, "inprocess": {"1": base, "8": base}}})
    assert ratios == {"pocketsphinx": {"1": {"latency_p50": 2.0, "rtf_mean": 2.0, "throughput": 0.5}}}
    table = b.format_table({"pocketsphinx": {"served": {"1": served}}}, ratios)
    assert "pocketsphinx" in table and "x2.0" in table


def test_result_rtf_only_for_a_successful_request():
    assert _result(0, 1.0, audio=4.0).rtf == 0.25
    assert _result(0, None, error="x").rtf is None


def test_pocketsphinx_baseline_hears_a_piper_sentence():
    from omni_triton.paths import model_dir

    if not model_dir("piper-voices").exists():
        pytest.skip("piper voices not prepared (omni-triton prepare --models piper)")
    # noise off: Piper's sampling noise made one run in many read "france disparate" (WER 0.33)
    clip = b.piper_corpus(["The capital of France is Paris."], noise=False)[0]
    assert 1.0 < clip.seconds < 5.0 and clip.wav[:4] == b"RIFF"
    assert len(clip.pcm16) == pytest.approx(2 * clip.seconds * b.SAMPLE_RATE, rel=0.01)
    heard = b._pocketsphinx_worker()(clip.pcm16)
    assert b.word_error_rate([clip.text], [heard]) <= 0.2, heard
