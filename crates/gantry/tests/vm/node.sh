#!/bin/bash
# The guest half of crates/gantry/tests/vm_node.rs. Runs as root inside the systemd VM
# (scripts/vm): drives the real Gantry binary against Debian's containerd and runc on cgroup v2,
# and records what it sees under /mnt/host/results/<case>/ for the host-side test to assert on.
# It asserts nothing itself; a non-zero exit only means the guest could not be set up.
set -uo pipefail
. /mnt/host/lib.sh
ROOT=/var/lib/gantry
MANIFESTS=/etc/gantry/manifests
CONFIG=/etc/gantry/config.yaml
POD_LOGS=/var/log/pods
CG=/sys/fs/cgroup
GANTRY_PID=

setup() {
  install -m 0755 $H/gantry /usr/local/bin/gantry
  mkdir -p $MANIFESTS $ROOT $POD_LOGS
  sed -i 's#sandbox_image = .*#sandbox_image = "gantry.local/pause:v1"#' /etc/containerd/config.toml
  containerd_systemd_cgroup false || return 1
  local t
  for t in $H/*.oci.tar; do ctr -n k8s.io images import "$t" >/dev/null || return 1; done
  stat -fc %T $CG >$R/cgroup-fs
  # The machine the allocatable is computed from.
  nproc >$R/cpus
  awk '$1 == "MemTotal:" { print $2 * 1024 }' /proc/meminfo >$R/memory-bytes
  log "setup done: $(cat $R/cgroup-fs), $(containerd --version)"
}

# start_gantry CASE_DIR DRIVER [EXTRA_CONFIG]: the agent in standalone mode with static pods.
start_gantry() {
  cat >$CONFIG <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
podLogsDir: $POD_LOGS
enableServer: ${SERVER:-false}
fileCheckFrequency: 1s
cgroupDriver: $2
podPidsLimit: 100
# Node allocatable (enforceNodeAllocatable defaults to [pods]): kubepods gets the rest.
kubeReserved: {memory: 256Mi}
systemReserved: {cpu: 500m}
# The image has no resolv.conf and the guest no network.
resolvConf: ""
${3:-}
EOF
  # shellcheck disable=SC2086 # EXTRA_FLAGS is a list of flags
  gantry kubelet --config=$CONFIG --container-runtime-endpoint=unix:///run/containerd/containerd.sock \
    --root-dir=$ROOT --pod-manifest-path=$MANIFESTS --hostname-override=vm-node -v=4 ${EXTRA_FLAGS:-} 2>>"$1/gantry.log" &
  GANTRY_PID=$!
}

stop_gantry() {
  kill -TERM "$GANTRY_PID" 2>/dev/null
  wait "$GANTRY_PID" 2>/dev/null
  GANTRY_PID=
}

# Every pod's container printed END.
all_reported() { [ "$(grep -l '^.* END$' $POD_LOGS/*/main/*.log 2>/dev/null | wc -l)" -ge "$1" ]; }
no_pod_cgroups() { [ -z "$(find "$@" -name 'pod*' -o -name '*-pod*' 2>/dev/null)" ]; }

# "<cgroup> <file> <value>" for every cgroup below the given ones and the files the tests check.
dump_cgroups() {
  local d f
  find "$@" -type d 2>/dev/null | sort | while read -r d; do
    echo "${d#"$CG"} - -"
    for f in cpu.weight cpu.max memory.max memory.min pids.max cgroup.procs; do
      [ -r "$d/$f" ] && echo "${d#"$CG"} $f $(tr '\n' ' ' <"$d/$f")"
    done
  done
}

# "<pod log dir> <line>" for every container log line.
dump_container_output() {
  local f
  for f in $POD_LOGS/*/main/*.log; do
    [ -e "$f" ] || continue
    sed "s#^[^ ]* [^ ]* [^ ]* #$(basename "$(dirname "$(dirname "$f")")") #" "$f"
  done
}

# /stats/summary and /metrics/resource from Gantry (two summaries 2 s apart: usageNanoCores
# needs two samples), and right after, the pod cgroups' own counters to compare with:
# "<cgroup> <memory.current> <inactive_file> <usage_usec>".
fetch_stats() {
  local c=$1 d
  get() { busybox wget -q -O "$2" "http://127.0.0.1:10255$1"; }
  wait_for 60 get /stats/summary "$c/summary-1.json" || log "no /stats/summary"
  sleep 2
  get /stats/summary "$c/summary.json"
  get /metrics/resource "$c/metrics-resource.txt"
  find "$2" -type d \( -name 'pod*' -o -name '*-pod*' \) | while read -r d; do
    echo "${d#"$CG"} $(cat "$d/memory.current") $(awk '$1 == "inactive_file" {print $2}' "$d/memory.stat")" \
      "$(awk '$1 == "usage_usec" {print $2}' "$d/cpu.stat")"
  done >"$c/pod-cgroup-stats"
  # The containers' own cgroups, as the runtime named them below their pod's: "<pod> <child>".
  find "$2" -mindepth 2 -type d -path '*pod*/*' | while read -r d; do
    echo "$(dirname "${d#"$CG"}") $(basename "$d")"
  done >"$c/container-cgroups"
}

# The three QoS classes on one driver: limits in the pod cgroups and in the containers, the
# cgroups gone after the pods are deleted, and an orphaned pod cgroup removed.
case_qos() {
  local c=$R/$1 driver=$2 root=$3 orphan=$4 extra=$5
  mkdir -p "$c"
  log "case $1: driver $driver"
  containerd_systemd_cgroup "$([ "$driver" = systemd ] && echo true || echo false)" || return 1
  $orphan
  $extra setup "$c"
  # The node API's read-only port, for the stats (fetch_stats).
  SERVER=true start_gantry "$c" "$driver" "readOnlyPort: 10255
${EXTRA_CONFIG:-}"
  local t0=$SECONDS
  cp $H/pods/*.yaml $MANIFESTS/
  wait_for 180 all_reported 3 || log "not every pod reported"
  echo $((SECONDS - t0)) >"$c/seconds-to-running"
  cp $ROOT/pods.json "$c/pods.json"
  dump_cgroups "$CG/$root" >"$c/cgroups-running"
  dump_container_output >"$c/container-output"
  fetch_stats "$c" "$CG/$root"
  $extra record "$c"
  systemctl list-units --all --plain --no-legend 'kubepods*' >"$c/units-running"
  show_slices >"$c/slices-running"
  rm -f $MANIFESTS/*.yaml
  t0=$SECONDS
  # The orphan goes with the agent's first clean-up, a minute after its start.
  wait_for 150 no_pod_cgroups "$CG/$root" || log "pod cgroups left"
  echo $((SECONDS - t0)) >"$c/seconds-to-gone"
  dump_cgroups "$CG/$root" >"$c/cgroups-deleted"
  systemctl list-units --all --plain --no-legend 'kubepods*' >"$c/units-deleted"
  stop_gantry
  rm -rf $POD_LOGS/*
}

# The properties Gantry set on the kubepods slices (systemd driver).
show_slices() {
  local u
  systemctl list-units --all --plain --no-legend 'kubepods*.slice' | awk '{print $1}' | while read -r u; do
    echo "$u $(systemctl show -p CPUWeight -p CPUQuotaPerSecUSec -p MemoryMax -p TasksMax -p Delegate "$u" | tr '\n' ' ')"
  done
}

# The system containers (cgroupfs case): the agent in kubeletCgroups, a stray process of the
# root cgroup moved into systemCgroups, the runtime named by --runtime-cgroups. MemoryQoS is on
# in this case only.
STRAY=
system_containers() {
  case $1 in
    setup)
      sh -c "echo \$\$ >$CG/cgroup.procs; exec sleep 600" &
      STRAY=$!
      EXTRA_CONFIG="cgroupRoot: /
featureGates: {MemoryQoS: true}
kubeletCgroups: /gantry-kubelet
systemCgroups: /gantry-system"
      EXTRA_FLAGS=--runtime-cgroups=/system.slice/containerd.service
      wait_for 10 grep -qx '0::/' /proc/$STRAY/cgroup || log "the stray process is not in the root cgroup"
      ;;
    record)
      cat /proc/$STRAY/cgroup >"$2/stray-cgroup"
      cat /proc/"$GANTRY_PID"/cgroup >"$2/gantry-cgroup"
      kill "$STRAY"
      EXTRA_CONFIG= EXTRA_FLAGS=
      ;;
  esac
}

# kubeReserved and systemReserved enforced on kube.slice and system.slice (systemd case).
reserved_slices() {
  case $1 in
    setup)
      busctl call org.freedesktop.systemd1 /org/freedesktop/systemd1 org.freedesktop.systemd1.Manager \
        StartTransientUnit 'ssa(sv)a(sa(sv))' kube.slice replace 0 0 >/dev/null
      EXTRA_CONFIG="enforceNodeAllocatable: [pods, kube-reserved, system-reserved]
kubeReservedCgroup: /kube.slice
systemReservedCgroup: /system.slice"
      ;;
    record)
      {
        echo "kube.slice $(systemctl show -p MemoryMax kube.slice) $(cat $CG/kube.slice/memory.max)"
        echo "system.slice $(systemctl show -p CPUWeight system.slice) $(cat $CG/system.slice/cpu.weight)"
      } >"$2/reserved"
      EXTRA_CONFIG=
      ;;
  esac
}

orphan_cgroupfs() { mkdir -p $CG/kubepods/burstable/pod0rphan00-0000-4000-8000-000000000001; }
orphan_slice() {
  busctl call org.freedesktop.systemd1 /org/freedesktop/systemd1 org.freedesktop.systemd1.Manager \
    StartTransientUnit 'ssa(sv)a(sa(sv))' kubepods-burstable-pod0rphan00_0000_4000_8000_000000000001.slice \
    replace 0 0 >/dev/null
}

# A driver mismatch either way round: the first sandbox fails with a clear message.
# case_mismatch CASE GANTRY_DRIVER CONTAINERD_SYSTEMD_CGROUP
case_mismatch() {
  local c=$R/$1
  mkdir -p "$c"
  log "case $1"
  containerd_systemd_cgroup "$3" || return 1
  start_gantry "$c" "$2"
  cp $H/pods/besteffort.yaml $MANIFESTS/
  wait_for 120 grep -q 'SystemdCgroup' "$c/gantry.log" || log "no mismatch message"
  cp $ROOT/pods.json "$c/pods.json" 2>/dev/null
  stop_gantry
  rm -f $MANIFESTS/*.yaml
}

setup || exit 1
case_qos cgroupfs cgroupfs kubepods orphan_cgroupfs system_containers
case_qos systemd systemd kubepods.slice orphan_slice reserved_slices
case_mismatch mismatch cgroupfs true
case_mismatch mismatch-systemd systemd false
log "done"
