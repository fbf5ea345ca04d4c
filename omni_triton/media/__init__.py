"""Media encoding and decoding for the frontend and the stages: audio (soundfile), images (Pillow)."""
