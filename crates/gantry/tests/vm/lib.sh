#!/bin/bash
# What every guest script of the VM tests shares; they source it from the share
# (gantry_testkit::vm puts it next to the script as /mnt/host/lib.sh).
H=/mnt/host
R=$H/results

log() { echo "[$(cut -d' ' -f1 /proc/uptime)s] $*"; }

# wait_for SECONDS COMMAND...: polls COMMAND every 0.2 s until it succeeds; fails after SECONDS.
wait_for() {
  local deadline=$((SECONDS + $1))
  shift
  until "$@"; do
    [ "$SECONDS" -lt "$deadline" ] || return 1
    sleep 0.2
  done
}

# The runtime's cgroup driver: SystemdCgroup = true|false in containerd's runc options.
containerd_systemd_cgroup() {
  sed -i "s/SystemdCgroup = .*/SystemdCgroup = $1/" /etc/containerd/config.toml
  systemctl restart containerd
  wait_for 60 ctr version >/dev/null 2>&1
}
