"""get_or_spawn_controller: one actor per name, in the controller's process, from anywhere."""

import subprocess
import sys
import textwrap

import pytest

from monarch_nb import Actor, MeshUsageError
from monarch_nb.actor import get_or_spawn_controller

# Run as a program of its own: the table of singletons is per client process,
# and the ranks learn where it is from the environment they start with.
PROGRAM = """
from monarch_nb.actor import (
    Actor, ActorError, current_actor_name, endpoint, get_or_spawn_controller, this_host,
)


class Store(Actor):
    def __init__(self, tag="first"):
        self.tag, self.data = tag, {}

    @endpoint
    def put(self, key, value):
        self.data[key] = value

    @endpoint
    def get(self, key):
        return self.data[key]

    @endpoint
    def who(self):
        return current_actor_name(), self.tag


class Spawner(Actor):
    @endpoint
    async def make(self, name, tag):
        made = await get_or_spawn_controller(name, Store, tag=tag)
        return await made.who.call_one()


class Reader(Actor):
    @endpoint
    def read(self, key):
        return get_or_spawn_controller("store", Store).get().get.call_one(key).get()


class Broken(Actor):
    def __init__(self):
        raise ValueError("no store today")

    @endpoint
    def ping(self):
        return 1


early = this_host().spawn_procs(per_host={"procs": 1}).spawn("early", Reader)
try:
    early.read.call_one("a").get(timeout=60)
except ActorError as e:
    print("early:", "started before the controller made its first singleton" in str(e))

store = get_or_spawn_controller("store", Store).get(timeout=30)
store.put.call_one("a", 1).get(timeout=30)
print("again:", get_or_spawn_controller("store", Store, tag="x").get().who.call_one().get())
spawner = get_or_spawn_controller("spawner", Spawner).get(timeout=30)
print("inside:", spawner.make.call_one("second", "by spawner").get(timeout=30))
print("second:", get_or_spawn_controller("second", Store).get().who.call_one().get())

procs = this_host().spawn_procs(per_host={"procs": 2})
readers = procs.spawn("readers", Reader)
print("ranks:", readers.read.call("a").get(timeout=60).values())

broken = get_or_spawn_controller("broken", Broken).get(timeout=30)
try:
    broken.ping.call_one().get(timeout=30)
except Exception as e:
    print("broken call:", str(e))
try:
    get_or_spawn_controller("broken", Broken).get(timeout=30)
except Exception as e:
    print("broken again:", type(e).__name__)
procs.stop()
"""


def test_one_actor_per_name_from_the_controller_its_actors_and_the_ranks(tmp_path):
    script = tmp_path / "program.py"
    script.write_text(textwrap.dedent(PROGRAM))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    # A rank started before the table existed cannot reach it, and says how to fix it.
    assert "early: True" in lines
    # The second call gets the first actor: its arguments are not used.
    assert "again: ('this_proc/store[0]', 'first')" in lines
    # From an actor in the controller's process (awaited in an async endpoint).
    assert "inside: ('this_proc/second[0]', 'by spawner')" in lines
    assert "second: ('this_proc/second[0]', 'by spawner')" in lines
    # From each rank of a mesh (a sync endpoint): the controller's store, with its data.
    assert "ranks: [1, 1]" in lines
    # An __init__ that raised fails the calls, and later lookups, with its error.
    assert (
        "broken call: Broken.ping failed on rank 0: ValueError: no store today "
        "(raised by its __init__, so the actor does not exist)"
    ) in lines
    assert "broken again: SpawnError" in lines


def test_arguments_are_checked_before_anything_is_spawned():
    with pytest.raises(MeshUsageError, match=r"needs a name \(a str\), got 3"):
        get_or_spawn_controller(3, Actor)  # type: ignore[arg-type]
    with pytest.raises(MeshUsageError, match=r"subclass of monarch_nb.Actor, got <class 'int'>"):
        get_or_spawn_controller("x", int)  # type: ignore[type-var]
