"""The model's names as any client sees them: a name or source without the server's filesystem path
(`public_source`), and the ids this server answers to (`model_ids`: `--served-model-name`'s, then the
model's own), which /api/model, /v1 and /metrics all report."""

from __future__ import annotations

import re
from pathlib import Path

TYPABLE = re.compile(r"^[\w.:/@+-]+$")  # an id a client can type: no spaces, no parentheses
UNLOADED = "kvscope"  # the id before the model's facts are known


def public_source(text: str | None) -> str | None:
    """A name or source fit to show to any client: a filesystem path is cut to its last part."""
    if not text or not (text.startswith(("/", "~", "\\")) or (len(text) > 2 and text[1:3] in (":\\", ":/"))):
        return text
    return Path(text.replace("\\", "/")).name or text


def own_model_id(facts) -> str:
    """The model's own name as a client would type it: its source when that is an id (a hub id, a
    folder name, `fake`, the remote's id), else its name without how it runs
    ("SmolLM2-135M-Instruct (Q4_1 GGUF)" → "SmolLM2-135M-Instruct")."""
    if facts is None:
        return UNLOADED
    source = public_source(facts.source or facts.name) or ""
    if TYPABLE.match(source):
        return source
    name = (public_source(facts.name) or "").split(" (")[0].strip()
    return name if TYPABLE.match(name) else re.sub(r"[^\w.:/@+-]+", "-", name).strip("-") or UNLOADED


def model_ids(facts, served_names: str | list[str] | tuple[str, ...] = ()) -> list[str]:
    """Every id this server answers to: the `--served-model-name` names (the first is the one it
    reports, as vLLM's `model_name`), then the model's own name. One name may come as a plain
    string (KVSCOPE_SERVED_MODEL_NAMES=tiny-chat, which is not JSON)."""
    names = [served_names] if isinstance(served_names, str) else list(served_names or ())
    ids = [str(name) for name in names]
    own = own_model_id(facts)
    return ids + [own] if own not in ids else ids
