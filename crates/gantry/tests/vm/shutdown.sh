#!/bin/bash
# The guest half of crates/gantry/tests/vm_shutdown.rs. Runs as root inside the systemd VM
# (scripts/vm, started with VM_FORWARD): the real Gantry (graceful node shutdown on, with the
# cgroup driver the host put in the share's `driver` file: systemd or cgroupfs, containerd's
# SystemdCgroup to match) joins the host test's API server at 10.0.2.100:6443. Once the host has its pods
# running (results/go), this script powers the machine off the way an operator does
# (`systemctl poweroff`, through logind), and the pods' SIGTERM handlers and Gantry's log land in
# results/ on the share. It records logind's InhibitDelayMaxUSec before and after Gantry started
# and the drop-in Gantry wrote, and the containers' memory.oom.group; it asserts nothing itself.
set -uo pipefail
. /mnt/host/lib.sh
ROOT=/var/lib/gantry
CONFIG=/etc/gantry/config.yaml
KUBECONFIG=/etc/gantry/kubeconfig
DRIVER=$(cat $H/driver)
# Where the driver puts the pods' cgroups.
case "$DRIVER" in
  systemd) KUBEPODS=/sys/fs/cgroup/kubepods.slice ;;
  cgroupfs) KUBEPODS=/sys/fs/cgroup/kubepods ;;
  *) log "unknown cgroup driver in $H/driver: $DRIVER"; exit 1 ;;
esac

inhibit_delay() {
  busctl get-property org.freedesktop.login1 /org/freedesktop/login1 org.freedesktop.login1.Manager InhibitDelayMaxUSec
}

setup() {
  join_cluster_setup || return 1
  # A network config, so that the runtime reports its network ready and the Node is Ready
  # until the shutdown (the pods use the host's network; no plugin runs for them).
  mkdir -p /etc/cni/net.d
  echo '{"cniVersion": "1.0.0", "name": "lo", "plugins": [{"type": "loopback"}]}' >/etc/cni/net.d/10-lo.conflist
  containerd_systemd_cgroup "$([ "$DRIVER" = systemd ] && echo true || echo false)" || return 1
  local t
  for t in $H/*.oci.tar; do ctr -n k8s.io images import "$t" >/dev/null || return 1; done
  stat -fc %T /sys/fs/cgroup >$R/cgroup-fs
  inhibit_delay >$R/inhibit-delay-before
  log "setup done: $(cat $R/cgroup-fs), driver $DRIVER, $(containerd --version), logind $(cat $R/inhibit-delay-before)"
}

setup || exit 1
cat >$CONFIG <<CFG
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# The read-only port only, for /metrics during the shutdown.
enableServer: true
port: 10250
readOnlyPort: 10255
cgroupDriver: $DRIVER
resolvConf: ""
shutdownGracePeriod: 45s
shutdownGracePeriodCriticalPods: 33s
CFG
gantry kubelet --config=$CONFIG --kubeconfig=$KUBECONFIG --container-runtime-endpoint=unix:///run/containerd/containerd.sock \
  --root-dir=$ROOT --hostname-override=vm-node -v=4 2>>"$R/gantry.log" &
GANTRY_PID=$!
# Gantry raises logind's delay before it takes its lock; the lock shows in systemd-inhibit.
wait_for 120 sh -c 'systemd-inhibit --list --no-legend --no-pager | grep -q kubelet' || { log "no inhibitor lock"; exit 1; }
inhibit_delay >$R/inhibit-delay-after
# Gantry's own oom_score_adj (oomScoreAdj, -999 by default), set at its start.
cat /proc/$GANTRY_PID/oom_score_adj >$R/gantry-oom-score-adj
systemd-inhibit --list --no-pager >$R/inhibitors
cp /etc/systemd/logind.conf.d/99-kubelet.conf $R/logind-drop-in 2>/dev/null
touch $R/ready
log "gantry holds its lock; waiting for the host's pods"
wait_for 600 test -e $R/go -o -e $R/abort || { log "the host never said go"; exit 1; }
[ -e $R/abort ] && exit 1
# memory.oom.group of every cgroup below kubepods (the host picks its containers' by ID:
# systemd's cri-containerd-<id>.scope, cgroupfs's <id>, below the pod's cgroup).
find $KUBEPODS -name memory.oom.group | while read -r f; do
  echo "$f $(cat "$f")"
done >$R/oom-group
# The script's result goes first: the machine powers off without this script ending.
echo 0 >$R/rc
sync
# The uptime and the wall clock together, to place Gantry's timestamps among the pods' uptimes.
echo "$(cut -d' ' -f1 /proc/uptime) $(date +%s.%N)" >$R/poweroff-at
log "systemctl poweroff"
systemctl poweroff
# Keep going until the shutdown stops this unit (returning would let vm-runner force a
# poweroff at once), copying Gantry's shutdown state file and its shutdown metrics to the share
# as they change. systemd stops the unit once Gantry released its lock, so the state file's
# last copy, on that SIGTERM, has the shutdown's end.
trap 'cp $ROOT/graceful_node_shutdown_state $R/ 2>/dev/null; sync; exit 0' TERM
for _ in $(seq 3000); do
  cp $ROOT/graceful_node_shutdown_state $R/ 2>/dev/null
  # Through a rename: the shutdown's SIGTERM to this unit may kill grep half-way.
  busybox wget -q -O $R/metrics.tmp http://127.0.0.1:10255/metrics 2>/dev/null &&
    grep '^kubelet_graceful_shutdown' $R/metrics.tmp >$R/shutdown-metrics.new &&
    mv $R/shutdown-metrics.new $R/shutdown-metrics
  sync
  sleep 0.2
done
