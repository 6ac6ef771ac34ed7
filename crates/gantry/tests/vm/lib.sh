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

# Cluster mode: the NIC on qemu's restricted user network, whose one peer (10.0.2.100) is the
# host's test API server; its certificate names `kubernetes`.
network() {
  local nic
  nic=$(ip -o link | awk -F': ' '$2 != "lo" { print $2; exit }')
  [ -n "$nic" ] || { log "no network interface"; return 1; }
  ip link set "$nic" up && ip addr add 10.0.2.15/24 dev "$nic" || return 1
  echo "10.0.2.100 kubernetes" >>/etc/hosts
}

# Cluster mode's common set-up: Gantry and the node's kubeconfig from the share (into $ROOT and
# $KUBECONFIG, which the script sets), the network, and the locally built pause image.
join_cluster_setup() {
  install -m 0755 $H/gantry /usr/local/bin/gantry
  mkdir -p $ROOT /etc/gantry
  install -m 0600 $H/kubeconfig $KUBECONFIG
  network || return 1
  sed -i 's#sandbox_image = .*#sandbox_image = "gantry.local/pause:v1"#' /etc/containerd/config.toml
}
