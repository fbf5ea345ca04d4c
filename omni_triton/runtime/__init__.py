"""Process-level helpers of the stage stubs: cancel flags, child-process reaping, the vLLM runner."""
