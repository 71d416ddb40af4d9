"""The remote engine: the engine's interface over an OpenAI-compatible server (engine), its HTTP and
SSE (http) and the remote model's facts (facts)."""
