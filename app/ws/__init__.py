"""The WebSocket door: `routes.py` opens `/ws` (origin check, socket cap, bounded sends) and
`session.py` runs one socket's side of the protocol (docs/protocol.md)."""
