"""Media encoding and decoding for the frontend and the stages: audio (soundfile), images (Pillow),
video (PyAV); chat input media (``inputs``: content parts -> PCM / RGB / frames) and the http(s)
media URL fetcher (``fetch``)."""
