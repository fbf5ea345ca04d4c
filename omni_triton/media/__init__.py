"""Media encoding and decoding for the frontend and the stages: audio (soundfile), images (Pillow),
video (PyAV); chat input media (``inputs``: content parts -> PCM / RGB / frames) and the http(s)
media URL fetcher (``fetch``).

Client bytes are decoded by one bounded decoder per kind (decompression-safe: header checked
before decoding, decoding stopped at the limits): ``audio.decode_audio``, ``image.open_image``
and ``inputs.sample_video_frames``."""
