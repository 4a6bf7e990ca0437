"""``sync_workspace()`` of a 100 MiB tree to two hosts, by each transport, beside rsync alone.

Run (root, Linux, ``rsync`` installed): ``python benchmarks/bench_workspace.py
[--mib 100] [--runs 3]``.

The hosts are the multi-host tests' network-namespace hosts, each with its
own sshd and its own empty tmpfs at the destination (no shared file system
there). The tree is ``--mib`` files of 1 MiB each, half random bytes (as
weights or compressed data) and half text (as code), written once. Each run,
into fresh destinations: ``hosts.sync_workspace(tree)`` to both hosts with
``transport="agent"`` and with ``transport="rsync"``, and, as the baseline in
the same run, ``rsync -a`` of the same tree to both hosts in parallel over the
same ssh; then one file of the tree is edited and all three sync again.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "multihost"))

from cluster import NetnsCluster  # noqa: E402

from monarch_nb import ssh_hosts  # noqa: E402


def make_tree(root: str, mib: int) -> None:
    text = ("def step(batch):\n    return model(batch).sum()\n" * 30_000).encode()[: 1 << 20]
    for i in range(mib):
        sub = os.path.join(root, f"part{i // 10}")
        os.makedirs(sub, exist_ok=True)
        data = os.urandom(1 << 20) if i % 2 else text
        with open(os.path.join(sub, f"file{i}.bin" if i % 2 else f"mod{i}.py"), "wb") as f:
            f.write(data)


def rsync_both(cluster: NetnsCluster, tree: str, dest: str) -> float:
    ssh = " ".join(["ssh", *cluster.ssh_options])
    t0 = time.perf_counter()
    procs = [
        subprocess.Popen(["rsync", "-a", "-e", ssh, f"{tree}/", f"{host}:{dest}/"])
        for host in cluster.hosts
    ]
    for p in procs:
        if p.wait(timeout=600) != 0:
            raise RuntimeError(f"rsync failed: {p.returncode}")
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=100)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    if shutil.which("rsync") is None:
        raise SystemExit("bench_workspace: needs rsync (apt-get install rsync)")
    tree = tempfile.mkdtemp(prefix="mnb-tree-")
    ways = ("agent", "rsync", "raw")
    full: dict[str, list[float]] = {way: [] for way in ways}
    again: dict[str, list[float]] = {way: [] for way in ways}
    try:
        make_tree(tree, args.mib)
        with NetnsCluster(2) as cluster:
            hosts = ssh_hosts(
                cluster.hosts, ssh_options=cluster.ssh_options, bind=cluster.controller_address
            )

            def sync(way: str, dest: str) -> float:
                if way == "raw":
                    return rsync_both(cluster, tree, dest)
                t0 = time.perf_counter()
                hosts.sync_workspace(tree, dest=dest, on_path=False, transport=way)
                return time.perf_counter() - t0

            try:
                for run in range(args.runs):
                    dests = {w: os.path.join(cluster.private_dir, f"{w}{run}") for w in ways}
                    for way in ways:
                        full[way].append(sync(way, dests[way]))
                    with open(os.path.join(tree, "part0", "mod0.py"), "ab") as f:
                        f.write(f"# edit {run}\n".encode())
                    for way in ways:
                        again[way].append(sync(way, dests[way]))
                    for host in cluster.hosts:  # each host's tmpfs holds 1 GiB
                        gone = ["ssh", *cluster.ssh_options, host, "rm", "-rf", *dests.values()]
                        subprocess.run(gone, check=True, timeout=60)
            finally:
                hosts.shutdown()
    finally:
        shutil.rmtree(tree, ignore_errors=True)
    print(
        f"| {args.mib} MiB tree to 2 hosts, median of {args.runs} | transport='agent' "
        "| transport='rsync' | rsync -a over ssh (baseline) | ratios |"
    )
    print("|---|---:|---:|---:|---:|")
    for label, times in (("first sync", full), ("again, one file edited", again)):
        a, r, b = (statistics.median(times[w]) for w in ways)
        print(f"| {label} | {a:.2f} s | {r:.2f} s | {b:.2f} s | {a / b:.2f}x, {r / b:.2f}x |")
    print(f"\n(every run: {dict(full)}, {dict(again)})")


if __name__ == "__main__":
    main()
