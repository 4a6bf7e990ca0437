"""Keys of a multi-host mesh: the agent key (HMAC) and CURVE key pairs.

A launcher makes them per host mesh and hands them to agents through its own
secure channel (ssh's stdin, srun's stdin); for agents started by other tools
they live in a key file that only its owner may read (``monarch-nb keygen``).
They never appear on a command line or in an environment variable.
"""

from __future__ import annotations

import json
import os
import stat
import threading
from typing import Any

import zmq
from zmq.auth.thread import ThreadAuthenticator

from ._signed import new_key


def new_keys() -> dict[str, Any]:
    """A fresh agent key and CURVE key pairs for the controller (server) and agents."""
    server_public, server_secret = zmq.curve_keypair()
    client_public, client_secret = zmq.curve_keypair()
    return {
        "key": new_key().hex(),
        "curve": {
            "server_public": server_public.decode(),
            "server_secret": server_secret.decode(),
            "client_public": client_public.decode(),
            "client_secret": client_secret.decode(),
        },
    }


def write_key_file(path: str) -> None:
    """Write fresh keys to ``path``, readable by its owner only (refuses to overwrite)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(new_keys(), f)
        f.write("\n")


_CURVE_FIELDS = ("server_public", "server_secret", "client_public", "client_secret")


def read_key_file(path: str) -> dict[str, Any]:
    """The keys in ``path``; refuses, as ssh does, a file that others could read
    or that belongs to another user (who could swap the keys for their own)."""
    try:
        info = os.stat(path)
    except OSError as exc:
        raise SystemExit(f"monarch_nb: cannot read key file {path!r}: {exc.strerror}") from None
    if info.st_uid != os.geteuid():
        raise PermissionError(
            f"key file {path!r} belongs to uid {info.st_uid}, not to you (uid {os.geteuid()}); "
            f"use a key file of your own (make one: monarch-nb keygen)"
        )
    if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise PermissionError(
            f"key file {path!r} is readable by others (mode {stat.S_IMODE(info.st_mode):o}); "
            f"run: chmod 600 {path}"
        )
    with open(path) as f:
        text = f.read()
    try:
        keys = json.loads(text)
    except ValueError:
        keys = None
    problem = _key_file_problem(keys)
    if problem:
        raise ValueError(
            f"{path!r} is not a monarch_nb key file ({problem}); make a new one: monarch-nb keygen"
        )
    return keys


def _key_file_problem(keys: Any) -> str:
    """What is wrong with a parsed key file, or "" when it is well formed."""
    if not isinstance(keys, dict):
        return "not a JSON object"
    try:
        if len(bytes.fromhex(keys.get("key", ""))) < 16:
            return "'key' is too short"
    except (TypeError, ValueError):
        return "'key' is not hex"
    curve = keys.get("curve")
    if not isinstance(curve, dict):
        return "no 'curve' key pairs"
    for field in _CURVE_FIELDS:
        value = curve.get(field)
        if not isinstance(value, str) or len(value) != 40:
            return f"'curve.{field}' is not a 40-character Z85 key"
    return ""


def agent_config_from_file(path: str) -> dict[str, Any]:
    keys = read_key_file(path)
    return {"key": keys["key"], "curve": keys["curve"]}


class _AllowedKeys:
    """A ZAP credentials provider: exactly the client keys added (z85)."""

    def __init__(self) -> None:
        self.keys: set[bytes] = set()

    def callback(self, domain: str, key: bytes) -> bool:
        return key in self.keys


_authenticators: dict[int, tuple[ThreadAuthenticator, _AllowedKeys]] = {}
_lock = threading.Lock()


def allow_only(context: zmq.Context, *client_publics: str) -> None:
    """Make CURVE servers of ``context`` accept these client keys (and any added
    later by another call), and no other: ZAP, run on a thread of pyzmq's."""
    with _lock:
        entry = _authenticators.get(id(context))
        if entry is None:
            auth = ThreadAuthenticator(context)
            auth.start()
            allowed = _AllowedKeys()
            auth.configure_curve_callback(domain="*", credentials_provider=allowed)
            entry = _authenticators[id(context)] = (auth, allowed)
        entry[1].keys.update(k.encode() for k in client_publics)
