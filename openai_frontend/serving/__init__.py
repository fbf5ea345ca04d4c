"""Per-API serving logic between the routers (HTTP bindings) and the ``Engine``:
``common`` (model resolution, admission scope), ``speech``, ``chat`` (chat and completions),
``images`` (generations, edits, and images for chat on a diffusion model)."""
