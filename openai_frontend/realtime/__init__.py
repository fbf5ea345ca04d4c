"""The OpenAI Realtime API over the omni models (``WS /v1/realtime``, docs/realtime.md).

``protocol``: the two event namings (GA and beta), the session configuration and its
validation, the JSON of items and errors; ``conversation``: the items of a session and the rule
that fits them into the model's context; ``session``: one session's state machine (audio buffer,
server VAD, responses on ``Engine.generate``, barge-in). ``serving/realtime.py`` binds it to the
WebSocket with the limits.
"""
