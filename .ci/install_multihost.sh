#!/usr/bin/env bash
# Installs what tests/multihost needs to make several "hosts" on one machine:
# OpenSSH's server (one sshd per network namespace, started by the tests) and
# SLURM + munge (a single-node cluster, started by the tests). Idempotent: a
# package already installed is skipped. Never leaves a system daemon running:
# the tests start their own, with per-test keys and config.
set -euo pipefail

# package -> a file it installs, to tell whether it is present without dpkg
# being slow or locale-dependent.
declare -A marker=(
    [openssh-server]=/usr/sbin/sshd
    [slurm-wlm]=/usr/sbin/slurmctld
    [slurm-client]=/usr/bin/srun
    [munge]=/usr/sbin/munged
    [iproute2]=/usr/sbin/ip
    [procps]=/usr/bin/pgrep
    [rsync]=/usr/bin/rsync  # sync_workspace(transport="rsync") between the hosts
)
missing=()
for pkg in "${!marker[@]}"; do
    if [ -x "${marker[$pkg]}" ]; then
        echo "install_multihost: $pkg present (${marker[$pkg]})"
    else
        missing+=("$pkg")
    fi
done
if [ "${#missing[@]}" -eq 0 ]; then
    echo "install_multihost: nothing to install"
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    echo "install_multihost: not root; cannot install ${missing[*]}" >&2
    exit 1
fi

start=$(date +%s)
daemons_before=$(pgrep -x 'sshd|munged|slurmctld|slurmd|slurmdbd' 2>/dev/null || true)
# Debian's maintainer scripts start sshd (port 22 of the root namespace), munged
# and the SLURM daemons on install; policy-rc.d exit 101 forbids any of that.
# An existing policy-rc.d is kept and put back.
policy=/usr/sbin/policy-rc.d
saved=""
if [ -e "$policy" ]; then
    saved=$(mktemp)
    cp -p "$policy" "$saved"
fi
restore_policy() {
    if [ -n "$saved" ]; then mv "$saved" "$policy"; else rm -f "$policy"; fi
}
trap restore_policy EXIT
printf '#!/bin/sh\nexit 101\n' >"$policy"
chmod 755 "$policy"

export DEBIAN_FRONTEND=noninteractive
echo "install_multihost: installing ${missing[*]}"
timeout 300 apt-get update -qq
timeout 900 apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null

# Belt and braces: were a daemon started anyway (an init shim that ignores
# policy-rc.d), stop it: the tests must own every sshd/munged/slurm* they talk
# to. Only a daemon that is new since the install began and detached (parent
# pid 1): the machine's own sshd and the tests' daemons are left alone.
for daemon in sshd munged slurmctld slurmd slurmdbd; do
    for pid in $(pgrep -x "$daemon" 2>/dev/null || true); do
        if ! grep -qx "$pid" <<<"$daemons_before" &&
            [ "$(ps -o ppid= -p "$pid" | tr -d ' ')" = 1 ]; then
            echo "install_multihost: stopping $daemon ($pid), started by the install"
            kill "$pid" 2>/dev/null || true
        fi
    done
done

echo "install_multihost: installed ${missing[*]} in $(($(date +%s) - start)) s"
