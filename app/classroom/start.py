"""What `kvscope serve --class` sets up before the server starts (called by kvscope/cli.py): the class's
default policy, this machine's LAN address and host names, the teacher's key, and the start banner
(join URL, teacher URL, who can reach the model, which scheduling policy runs)."""

from __future__ import annotations

import os
import secrets
import socket
from typing import Any

from app.security import is_loopback
from model_runner.local import config as engine_defaults
from model_runner.shared.policy import Policy

# A class's default policy. Measured (docs/classroom.md, "Capacity"): 30 simulated students on a
# 2-core CPU answered 86 requests a minute with continuous batching alone and 196 with these two on,
# because a step that admits a student then prefills at most 64 of its prompt tokens, and the class's
# shared handout is computed once. Each can be turned off with a flag or from /class.
CLASS_POLICY: dict[str, Any] = {"chunked_prefill": True, "chunk_size": 64, "prefix_caching": True}
REMOTE_POLICY_LINE = "kvscope: class policy: the remote server's own (it schedules its requests itself)"
OFF_FLAGS = {"chunked_prefill": "--no-chunked-prefill", "prefix_caching": "--no-prefix-caching"}


def class_policy(given: dict[str, Any]) -> dict[str, Any]:
    """The policy changes a class starts with: CLASS_POLICY under what the environment and flags gave."""
    return {**CLASS_POLICY, **given}


def lan_address() -> str:
    """This machine's address on the local network: the source address of a route to a public
    address (a UDP connect sends nothing), else the hostname's; 127.0.0.1 with no network at all."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1: never reached, only routed
            return probe.getsockname()[0]
    except OSError:
        pass
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def class_setup(
    bind: str, port: int, names: list[str] | None, policy: dict[str, Any] | None, key: str | None = None
) -> tuple[dict, list[str]]:
    """(app config, lines to print) for a class: the LAN address and hostname (and `names`) as Host
    names, a teacher key (KVSCOPE_TEACHER_KEY or a fresh random one), the join and teacher URLs, and
    the policy the server starts with (`policy`: the changes from the engine's defaults; None for a
    remote engine, which schedules itself)."""
    specific = bind not in ("0.0.0.0", "::", "") and not is_loopback(bind)
    lan = bind if specific else lan_address()  # --host given as one address: students use that one
    key = key or os.environ.get("KVSCOPE_TEACHER_KEY") or secrets.token_urlsafe(16)
    host = f"[{lan}]" if ":" in lan else lan
    join = f"http://{host}:{port}/"
    config = {"CLASS_MODE": True, "TEACHER_KEY": key, "CLASS_HOSTS": host_names(lan, names), "JOIN_URL": join}
    lines = [
        f"kvscope: class mode: students open {join}",
        f"kvscope: teacher view (project it; keep this address to yourself): {join}class?key={key}",
        f"kvscope: WARNING: anyone on this network who can reach {lan}:{port} can now use the model, without "
        "logging in; only the teacher's key changes settings",
        policy_line(engine_defaults.POLICY.updated(policy)) if policy is not None else REMOTE_POLICY_LINE,
    ]
    return config, lines


def host_names(lan: str, names: list[str] | None) -> list[str]:
    """The Host names students may use: the LAN address, the hostname (and its mDNS name), `names`."""
    hostname = socket.gethostname()
    hosts = [lan, hostname, *(names or [])]
    if "." not in hostname:
        hosts.append(f"{hostname}.local")  # mDNS, as macOS and most Linux desktops answer
    return hosts


def policy_line(policy: Policy) -> str:
    """The banner's line on scheduling: what runs, and how to turn off what a class turns on."""
    prefill = f"chunked prefill ({policy.chunk_size} tokens)" if policy.chunked_prefill else "whole-prompt prefill"
    caching = "prefix caching on" if policy.prefix_caching else "prefix caching off"
    now = policy.to_dict()
    off = [flag for name, flag in OFF_FLAGS.items() if now[name]]
    how = f"off with {', '.join(off)} or from /class" if off else "the teacher can change them on /class"
    return f"kvscope: class policy: {policy.batching} batching, up to {policy.max_num_seqs} in a batch, {prefill}, {caching} ({how})"
