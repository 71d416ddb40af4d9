"""The OpenAI-compatible API: routes, the chat and completions mappings, and their shared shapes."""
