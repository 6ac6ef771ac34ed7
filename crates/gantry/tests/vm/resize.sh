#!/bin/bash
# The guest half of crates/gantry/tests/vm_resize.rs. Runs as root inside the systemd VM
# (scripts/vm, started with VM_FORWARD): the real Gantry joins the host test's API server, which
# it reaches at 10.0.2.100:6443 (the VM's only network peer), once per cgroup driver. While a
# case runs it copies the pod cgroups' limits (and the pod slices' properties) to /mnt/host/results/<case>/cgroups every second;
# the host drives the resize through the API, asserts, and ends the case by writing
# results/<case>/done (or results/abort). It asserts nothing itself.
set -uo pipefail
. /mnt/host/lib.sh
ROOT=/var/lib/gantry
CONFIG=/etc/gantry/config.yaml
KUBECONFIG=/etc/gantry/kubeconfig
CG=/sys/fs/cgroup
GANTRY_PID=

setup() {
  join_cluster_setup || return 1
  local t
  for t in $H/*.oci.tar; do ctr -n k8s.io images import "$t" >/dev/null || return 1; done
  stat -fc %T $CG >$R/cgroup-fs
  log "setup done: $(cat $R/cgroup-fs), $(containerd --version)"
}

# "<cgroup> <file> <value>" for every cgroup below $1.
dump_cgroups() {
  local d f
  find "$1" -type d 2>/dev/null | sort | while read -r d; do
    for f in cpu.max memory.max; do
      [ -r "$d/$f" ] && echo "${d#"$CG"} $f $(cat "$d/$f" 2>/dev/null)"
    done
  done
}

# "unit:<slice> <property> <value>" for the pod slices: what systemd itself holds.
dump_slices() {
  local u
  systemctl list-units --all --plain --no-legend 'kubepods-*pod*.slice' | awk '{print $1}' | while read -r u; do
    systemctl show -p CPUQuotaPerSecUSec -p MemoryMax "$u" | sed "s#^\([^=]*\)=#unit:$u \1 #"
  done
}

# case_resize DRIVER KUBEPODS: Gantry in cluster mode on DRIVER until the host is done.
case_resize() {
  local c=$R/$1 dumper
  mkdir -p "$c"
  log "case $1"
  containerd_systemd_cgroup "$([ "$1" = systemd ] && echo true || echo false)" || return 1
  cat >$CONFIG <<CFG
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
enableServer: false
cgroupDriver: $1
# The image has no resolv.conf, and the pods use the host's network.
resolvConf: ""
CFG
  gantry kubelet --config=$CONFIG --kubeconfig=$KUBECONFIG --container-runtime-endpoint=unix:///run/containerd/containerd.sock \
    --root-dir=$ROOT --hostname-override=vm-node -v=4 2>>"$c/gantry.log" &
  GANTRY_PID=$!
  # A sample a second of what the kernel holds; the host polls it with a deadline.
  while :; do { dump_cgroups "$CG/$2"; dump_slices; } >"$c/cgroups.tmp"; mv "$c/cgroups.tmp" "$c/cgroups"; sleep 1; done &
  dumper=$!
  touch "$c/ready"
  wait_for 900 test -e "$c/done" -o -e "$R/abort" || log "the host never finished case $1"
  kill "$dumper"
  kill -TERM "$GANTRY_PID"
  wait "$GANTRY_PID"
  log "case $1 finished"
}

setup || exit 1
case_resize cgroupfs kubepods
[ -e $R/abort ] || case_resize systemd kubepods.slice
log "done"
