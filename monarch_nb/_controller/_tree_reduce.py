"""A reduced call's way down (a plan per subtree root) and its folds' way back.

A :class:`~.._runtime._reduced_call.ReducedCall` to ranks on hosts goes to each
subtree root of the cast tree (``_agent_tree``), or to each host when there is
no tree, with an ``F`` envelope (:mod:`.._wire._tree_fold`): every agent on the
way folds its ranks' replies and its children's partial folds, and each root
sends one :class:`~.._wire._tree_fold.FoldedReply` (signed with its agent key,
checked like all it says). So the controller reads ``f0`` messages per call,
not one per rank; the ranks each root's fold covers are recorded at send time,
and a fold counts for those only. Ranks on no host (a local mesh) reply on
their own, and the call folds their replies itself, with the same code.
"""

from __future__ import annotations

import logging
from typing import Any

from .._model._errors import MeshFailure
from .._model._reducers import CODES, Partial
from .._runtime._reduced_call import ReducedCall
from .._wire._tree_fold import FOLD, FoldedReply, encode_node, head

_log = logging.getLogger("monarch_nb")


_CACHED = 256  # distinct rank sets whose fold plans are kept


def fold_routes(
    group: Any, ranks: tuple[int, ...], call: ReducedCall
) -> list[tuple[bytes | None, Any]]:
    """``(agent identity, F + head + node)`` per subtree root (or host) with ranks of
    the call; records what each root's fold covers. Under the controller's send lock."""
    agents = group.agents
    if agents is None:
        return group.routes(ranks)
    tree = agents.tree
    workers = group.workers
    now = tuple(map(workers.__getitem__, ranks))
    cached = tree.fold_plans.get((tree.roots is not None, ranks))
    if cached is None or cached[0] != now:  # made again after a restart or a lost host
        cached = (now, _plans(tree, workers, ranks))
        if len(tree.fold_plans) >= _CACHED:
            tree.fold_plans.clear()
        tree.fold_plans[(tree.roots is not None, ranks)] = cached
    prefix = FOLD + head(call.call_id, CODES[call.reducer])
    routes: list[tuple[bytes | None, Any]] = []
    for identity, node, covered in cached[1]:
        call.covers[identity] = covered
        routes.append((identity, prefix + node))
    call_id, folds = call.call_id, tree.folds
    folds[call_id] = call
    call.add_done_callback(lambda _: folds.pop(call_id, None))
    return routes


def _plans(
    tree: Any, workers: list[Any], ranks: tuple[int, ...]
) -> list[tuple[bytes, bytes, tuple[int, ...]]]:
    """``(root identity, node, ranks covered)`` per subtree root (or host)."""
    by_route: dict[bytes, list[tuple[int, bytes]]] = {}
    for r in ranks:
        worker = workers[r]
        by_route.setdefault(worker.route, []).append((r, worker.identity))
    if not tree.active:
        return [
            (identity, encode_node(own, ()), tuple(r for r, _ in own))
            for identity, own in by_route.items()
        ]

    def node_of(node: Any, covered: list[int]) -> bytes | None:
        own = by_route.get(node.agent.identity, [])
        children = []
        for child in node.children:
            below = node_of(child, covered)
            if below is not None:
                children.append((tree.endpoints[child.agent.index], below))
        if not own and not children:
            return None
        covered += [r for r, _ in own]
        return encode_node(own, children)

    plans = []
    for root in tree.roots:
        covered: list[int] = []
        made = node_of(root, covered)
        if made is not None:
            plans.append((root.agent.identity, made, tuple(sorted(covered))))
    return plans


def on_folded(hosts: Any, agent: Any, message: FoldedReply) -> None:
    """(The receiving thread) ``agent``'s fold of its subtree's replies."""
    call = hosts.tree.folds.get(message.call_id)
    if call is None:
        return  # the call ended already (failed, cancelled): a late fold is moot
    try:
        partial = Partial.from_json(message.partial)
        wrong = call.add_fold(agent.identity, partial, message.passed, message.lost)
    except (ValueError, TypeError) as exc:
        wrong = str(exc)
    if wrong is not None:
        _log.error("monarch_nb: host %s sent %s", agent.label, wrong)
        call.fail(
            MeshFailure(
                f"{call.label}: host {agent.label}'s agent sent {wrong} (a bug: please report "
                "it); call again, or fold with a function as combine",
                ranks=tuple(call.unanswered_ranks()),
            )
        )
