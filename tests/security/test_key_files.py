"""Finding 14: key files are trusted only when they are ours and well formed.

A 0600 key file owned by another user used to be accepted (ssh refuses one:
its owner can replace the keys with their own and so impersonate the agent);
an empty or malformed file gave a raw JSONDecodeError or KeyError.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from listening_agent import start_listening_agent

from monarch_nb import MeshFailure, attach
from monarch_nb._wire import _keys

pytestmark = pytest.mark.timeout(60)

# Any uid other than ours serves: the file is merely handed to it, as an
# attacker who owns the file (or its directory) would have it.
OTHER_UID = 65534 if os.geteuid() != 65534 else 65533


def _keygen(path) -> None:
    subprocess.run([sys.executable, "-m", "monarch_nb", "keygen", str(path)], check=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
def test_a_key_file_owned_by_another_user_is_refused(tmp_path) -> None:
    key_file = tmp_path / "agent.key"
    _keygen(key_file)
    os.chown(key_file, OTHER_UID, -1)
    assert (key_file.stat().st_mode & 0o777) == 0o600
    with pytest.raises(PermissionError, match=rf"belongs to uid {OTHER_UID}, not to you"):
        _keys.read_key_file(str(key_file))
    with pytest.raises(PermissionError, match="belongs to uid"):
        attach(["tcp://127.0.0.1:1"], key_file=str(key_file))


def _good_keys(tmp_path) -> dict:
    path = tmp_path / "good.key"
    _keygen(path)
    return json.loads(path.read_text())


@pytest.mark.parametrize(
    ("mangle", "problem"),
    [
        (lambda k: "", "not a JSON object"),
        (lambda k: "{not json", "not a JSON object"),
        (lambda k: "[1, 2]", "not a JSON object"),
        (lambda k: json.dumps({**k, "key": "zz"}), "'key' is not hex"),
        (lambda k: json.dumps({**k, "key": "ab"}), "'key' is too short"),
        (lambda k: json.dumps({"key": k["key"]}), "no 'curve' key pairs"),
        (
            lambda k: json.dumps({**k, "curve": {**k["curve"], "client_secret": "short"}}),
            "'curve.client_secret' is not a 40-character Z85 key",
        ),
    ],
)
def test_a_malformed_key_file_says_what_is_wrong(tmp_path, mangle, problem) -> None:
    key_file = tmp_path / "agent.key"
    fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(mangle(_good_keys(tmp_path)))
    with pytest.raises(ValueError, match=rf"not a monarch_nb key file \({problem}\).*keygen"):
        _keys.read_key_file(str(key_file))


def test_a_well_formed_key_file_of_ours_is_read(tmp_path) -> None:
    keys = _good_keys(tmp_path)
    assert _keys.read_key_file(str(tmp_path / "good.key")) == keys


def test_the_agent_refuses_a_malformed_key_file_without_a_traceback(tmp_path) -> None:
    key_file = tmp_path / "agent.key"
    fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.close(fd)
    command = [sys.executable, "-m", "monarch_nb", "agent", "--listen", "tcp://127.0.0.1:0"]
    agent = subprocess.run(
        [*command, "--key-file", str(key_file)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert agent.returncode == 2
    assert "not a monarch_nb key file (not a JSON object)" in agent.stderr
    assert "Traceback" not in agent.stderr


def _write_keys(path, keys: dict) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(keys, f)


def test_an_agent_that_refuses_our_key_is_named_as_such(tmp_path) -> None:
    # It used to read "did not report within 60 s ... check ssh HOST" after a minute.
    agent_key, other = _good_keys(tmp_path), tmp_path / "other.key"
    _keygen(other)
    ours = json.loads(other.read_text())
    # The agent's server key but a client key pair it does not admit (its ZAP refuses).
    stranger = tmp_path / "stranger.key"
    _write_keys(
        stranger,
        {**ours, "curve": {**ours["curve"], "server_public": agent_key["curve"]["server_public"]}},
    )
    agent, address = start_listening_agent(tmp_path / "good.key")
    try:
        for key_file in (other, stranger):
            with pytest.raises(MeshFailure, match=r"refused our keys") as failure:
                attach([address], key_file=str(key_file), timeout=40)
            message = str(failure.value)
            assert address in message
            assert str(key_file) in message
            assert "ssh HOST" not in message
        hosts = attach([address], key_file=str(tmp_path / "good.key"))  # the right one works
        hosts.shutdown()
    finally:
        agent.terminate()
        agent.wait(10)
