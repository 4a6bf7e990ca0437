"""Casts down a tree of host agents, so the controller sends O(fan-out), not O(hosts).

A host mesh of more hosts than the first level's fan-out (the setting
``host_tree_fanout``, ``MONARCH_NB_HOST_TREE_FANOUT``: ``"32"``, or one fan-out
per level, ``"8,16"``, the last repeated below; ``"0"``: never a tree) relays
casts through a tree of its agents. The tree is fixed per host mesh, in host
order: the controller sends to up to ``f0`` agents, each relays to its own
workers and to up to ``f1`` agents below it, and so on. A cast to some hosts
only goes down the branches that lead to them (an agent with no rank in the
cast still relays when hosts below it have one); a root with nothing below it
gets the flat relay of before. See docs/scale.md for the cost per level.

Only casts go down the tree; everything else between the controller and an
agent (heartbeats, launches, logs, py-spy) stays on the direct link, and so
do the ranks' replies, each host's agent sending its own up. So a dead rank
is reported by its own agent as fast as without a tree, and a dead agent is
noticed as before (its launcher's exit, or its silence).

A lost agent that relayed casts leaves its subtree's ranks alive but maybe
without the casts it was relaying: every call still waiting on one of those
ranks fails at once, naming the lost host and the hosts it relayed to (the
call is not resent: a rank that did get it would run it twice), and the tree
is built again without the lost host, so the next cast goes around it.

The agents' tree links are CURVE with the host mesh's agent key pair, which
only the agents hold; what goes down them is the controller's message, signed
for the workers, which no agent can alter or forge (see :mod:`.._agent._tree`).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from .._model._errors import MeshFailure, MeshUsageError
from .._model._fold import format_ranks
from .._services import _config
from .._wire._messages import Message
from .._wire._tree import TREE, TreeListen, TreeListening, encode_node

_log = logging.getLogger("monarch_nb")
_CACHED_PLANS = 256  # distinct rank sets whose relay plans are kept


class TreeHosts(Protocol):
    """What the tree needs of a host mesh (``_hosts.HostAgents``)."""

    agents: Any  # list[AgentLink]
    controller: Any  # Controller

    def send(self, agent: Any, message: Message) -> None: ...


def parse_fanout(raw: str, what: str = "host_tree_fanout") -> tuple[int, ...]:
    """``"32"`` or ``"8,16"`` as fan-outs per level; ``"0"``: no tree (``()``)."""
    text = str(raw).strip()
    try:
        levels = tuple(int(part) for part in text.split(","))
    except ValueError:
        levels = ()
    if levels == (0,):
        return ()
    if not levels or any(n < 2 for n in levels):
        raise MeshUsageError(
            f"{what}={raw!r}: give the agents each level of the cast tree sends to, at "
            "least 2 each, e.g. '32' or '8,16' (the last repeats below), or '0' for none"
        )
    return levels


@dataclass
class _Node:
    agent: Any  # AgentLink
    children: list[_Node] = field(default_factory=list)

    def walk(self) -> list[_Node]:
        found = [self]
        for child in self.children:
            found.extend(child.walk())
        return found


def build(agents: list[Any], fanouts: tuple[int, ...], level: int = 0) -> list[_Node]:
    """``agents`` as subtrees of at most ``fanouts[level]`` at this level: contiguous
    runs of hosts, each headed by its first, the rest below it."""
    width = fanouts[min(level, len(fanouts) - 1)]
    if len(agents) <= width:
        return [_Node(agent) for agent in agents]
    nodes = []
    start = 0
    for i in range(width):
        end = start + (len(agents) - start) // (width - i)
        run = agents[start:end]
        nodes.append(_Node(run[0], build(run[1:], fanouts, level + 1)))
        start = end
    return nodes


class AgentTree:
    """One host mesh's cast tree (see the module docstring)."""

    def __init__(self, hosts: TreeHosts) -> None:
        self.hosts = hosts
        self.fanouts = parse_fanout(_config.get("host_tree_fanout"))
        self.roots: list[_Node] | None = None  # None: flat (a relay per host)
        self.endpoints: dict[int, bytes] = {}  # agent index -> its tree link
        self.errors: dict[int, str] = {}  # agent index -> why it has none
        self._answered = threading.Condition()
        # ranks -> (the workers the plan was made for, the plan): a cast to the same
        # ranks again costs a lookup (under the controller's send lock).
        self._plans: dict[tuple[int, ...], tuple[Any, list[tuple[bytes, Any]]]] = {}
        # Reduced calls (_tree_reduce): their plans, as above, and those in flight.
        self.fold_plans: dict[Any, Any] = {}
        self.folds: dict[int, Any] = {}  # call id -> ReducedCall

    @property
    def active(self) -> bool:
        return self.roots is not None

    def depth(self) -> int:
        """Levels of agents a cast goes down (0: no tree, 1: flat)."""

        def down(nodes: list[_Node]) -> int:
            return 1 + max((down(n.children) for n in nodes if n.children), default=0)

        return down(self.roots) if self.roots else 0

    # -- setting up (caller thread) ----------------------------------------------------

    def start(self, timeout: float) -> None:
        """Build the tree if the hosts are more than the first fan-out: each agent
        opens its tree link first (raises MeshFailure naming a host that could not)."""
        live = [a for a in self.hosts.agents if a.lost is None]
        if not self.fanouts or len(live) <= self.fanouts[0]:
            self._set(None)
            return
        waiting = [a for a in live if a.index not in self.endpoints]
        for agent in waiting:
            self.hosts.send(agent, TreeListen())
        deadline = time.monotonic() + timeout
        with self._answered:
            for agent in waiting:
                while agent.index not in self.endpoints and agent.index not in self.errors:
                    left = deadline - time.monotonic()
                    if left <= 0 or agent.lost is not None:
                        raise MeshFailure(
                            f"host {agent.label} did not open its cast-tree link within "
                            f"{timeout:.0f} s" + (f" ({agent.lost})" if agent.lost else "")
                        )
                    self._answered.wait(min(left, 0.5))
                if agent.index in self.errors:
                    raise MeshFailure(
                        f"host {agent.label} could not open its cast-tree link: "
                        f"{self.errors[agent.index]} (set host_tree_fanout='0' for no tree)"
                    )
        self.rebuild()

    def set_fanout(self, fanout: str | int, timeout: float = 60.0) -> None:
        """Use ``fanout`` (as the setting reads) from now on; blocks while agents
        open their tree links. Only with nothing in flight to the hosts: a message
        sent on a new path can overtake one still on the old."""
        self.fanouts = parse_fanout(str(fanout), "fanout")
        self.start(timeout)

    def on_listening(self, agent: Any, message: TreeListening) -> None:
        """(I/O thread) ``agent`` says where its tree link is."""
        with self._answered:
            if message.endpoint:
                self.endpoints[agent.index] = message.endpoint.encode()
            else:
                self.errors[agent.index] = message.error
            self._answered.notify_all()

    def rebuild(self) -> None:
        """The tree over the live agents now (any thread)."""
        live = [a for a in self.hosts.agents if a.lost is None]
        if self.fanouts and len(live) > self.fanouts[0]:
            self._set(build(live, self.fanouts))
        else:
            self._set(None)

    def _set(self, roots: list[_Node] | None) -> None:
        with self.hosts.controller.send_lock:  # no cast reads half of it
            self.roots = roots
            self._plans.clear()
            self.fold_plans.clear()

    # -- the send path (under the controller's send lock) -------------------------------

    def routes(self, workers: list[Any], ranks: tuple[int, ...]) -> list[tuple[bytes, Any]]:
        """``(agent identity, envelope)`` per subtree root with work for ``ranks``;
        the envelope a list of identities for a flat relay, or bytes (``T`` + node)."""
        # The workers now (a restart replaces some in place): the plan is for them.
        now = tuple(map(workers.__getitem__, ranks))
        cached = self._plans.get(ranks)
        if cached is not None and cached[0] == now:
            return cached[1]
        by_route: dict[bytes, list[bytes]] = {}
        for r in ranks:
            worker = workers[r]
            by_route.setdefault(worker.route, []).append(worker.identity)
        endpoints = self.endpoints
        plan: list[tuple[bytes, Any]] = []

        def below(n: _Node) -> list[tuple[bytes, bytes]]:
            found = []
            for child in n.children:
                under = below(child)
                own = by_route.get(child.agent.identity)
                if own or under:
                    found.append((endpoints[child.agent.index], encode_node(own or [], under)))
            return found

        assert self.roots is not None
        for root in self.roots:
            identity = root.agent.identity
            under = below(root)
            own = by_route.get(identity)
            if under:
                plan.append((identity, TREE + encode_node(own or [], under)))
            elif own:  # nothing to pass on: the flat relay
                plan.append((identity, own))
        if len(self._plans) >= _CACHED_PLANS:
            self._plans.clear()
        self._plans[ranks] = (now, plan)
        return plan

    # -- faults (I/O thread) ------------------------------------------------------------

    def _remove(self, agent: Any) -> list[Any]:
        """Take ``agent`` out of the tree, its children taking its place (every other
        host keeps its path, so nothing in flight to it is overtaken); the live
        agents that were below it."""
        assert self.roots is not None
        siblings: list[_Node] | None = None
        for level in [self.roots] + [n.children for r in self.roots for n in r.walk()]:
            if any(n.agent is agent for n in level):
                siblings = level
                break
        if siblings is None:
            return []
        node = next(n for n in siblings if n.agent is agent)
        with self.hosts.controller.send_lock:
            at = siblings.index(node)
            siblings[at : at + 1] = node.children
            self._plans.clear()
            self.fold_plans.clear()
        return [n.agent for c in node.children for n in c.walk() if n.agent.lost is None]

    def lost(self, agent: Any, why: str) -> None:
        """``agent``'s host is lost: fail the calls waiting on the ranks below it
        (they may never get what it was relaying), and route around it."""
        if self.roots is None:
            return
        below = self._remove(agent)
        if not below:
            return
        hosts = ", ".join(a.label for a in below)
        by_group: dict[int, tuple[Any, list[int]]] = {}
        for other in below:
            for group, worker in list(other.workers.values()):
                by_group.setdefault(group.id, (group, []))[1].append(worker.rank)
        for group, ranks in by_group.values():
            ranks = sorted(ranks)
            error = MeshFailure(
                f"host {agent.label} {why}; it relayed casts to hosts {hosts}, so calls "
                f"in flight to their ranks {format_ranks(ranks)} may not have reached them "
                "and fail here (those ranks are alive: call again; casts now go around "
                f"host {agent.label})",
                ranks=tuple(ranks),
            )
            failed = group.end_ranks(tuple(ranks), error, lambda: None)
            if failed:
                _log.warning(
                    "monarch_nb: %d call(s) to ranks below lost host %s failed",
                    failed,
                    agent.label,
                )
