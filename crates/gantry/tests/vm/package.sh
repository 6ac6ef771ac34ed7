#!/bin/bash
# The guest half of crates/gantry/tests/vm_package.rs. Runs as root inside the systemd VM
# (scripts/vm): installs Gantry's Debian package (scripts/package) over stand-ins for the Go
# kubelet's `kubelet` and `kubeadm` packages, runs it as kubelet.service from a kubeadm-shaped
# file layout, and removes it again. It records what it sees under /mnt/host/results/; the host
# side asserts. A non-zero exit only means the guest could not be set up.
set -uo pipefail
. /mnt/host/lib.sh
POD_LOGS=/var/log/pods

# Packages with the Go kubelet's file layout (the `kubelet` package ships the binary and the
# unit, `kubeadm` the drop-in). Their binary only says who it is: no cluster is needed to check
# what the package manager does with them.
go_packages() {
  local d=/tmp/go-kubelet d2=/tmp/go-kubeadm
  mkdir -p $d/DEBIAN $d/usr/bin $d/usr/lib/systemd/system $d2/DEBIAN $d2/usr/lib/systemd/system/kubelet.service.d
  printf '#!/bin/sh\necho "GO-KUBELET-STAND-IN $*"\nexec sleep infinity\n' >$d/usr/bin/kubelet
  chmod 0755 $d/usr/bin/kubelet
  printf '# go-kubelet unit\n[Service]\nExecStart=/usr/bin/kubelet\nRestart=always\n[Install]\nWantedBy=multi-user.target\n' \
    >$d/usr/lib/systemd/system/kubelet.service
  printf '# go-kubeadm drop-in\n[Service]\nExecStart=\nExecStart=/usr/bin/kubelet $KUBELET_EXTRA_ARGS\n' \
    >$d2/usr/lib/systemd/system/kubelet.service.d/10-kubeadm.conf
  printf 'Package: kubelet\nVersion: 1.34.0-1.1\nArchitecture: all\nMaintainer: test <t@localhost>\nDescription: stand-in\n' >$d/DEBIAN/control
  printf 'Package: kubeadm\nVersion: 1.34.0-1.1\nArchitecture: all\nMaintainer: test <t@localhost>\nDescription: stand-in\n' >$d2/DEBIAN/control
  dpkg-deb --root-owner-group --build $d /tmp/kubelet.deb >/dev/null && dpkg-deb --root-owner-group --build $d2 /tmp/kubeadm.deb >/dev/null &&
    dpkg -i /tmp/kubelet.deb /tmp/kubeadm.deb >/dev/null
}

# What `kubeadm join` leaves behind for the kubelet, minus the API server credentials (the VM has
# no cluster): the configuration, the flags file and the operator's defaults file.
kubeadm_files() {
  mkdir -p /var/lib/kubelet /etc/kubernetes/manifests /etc/systemd/system/kubelet.service.d
  cat >/var/lib/kubelet/config.yaml <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: systemd
staticPodPath: /etc/kubernetes/manifests
podLogsDir: $POD_LOGS
fileCheckFrequency: 1s
enableServer: false
rotateCertificates: true
resolvConf: ""
EOF
  echo 'KUBELET_KUBEADM_ARGS="--container-runtime-endpoint=unix:///run/containerd/containerd.sock --pod-infra-container-image=gantry.local/pause:v1"' \
    >/var/lib/kubelet/kubeadm-flags.env
  echo 'KUBELET_EXTRA_ARGS="--hostname-override=pkg-node"' >/etc/default/kubelet
  # No API server here: run standalone by emptying the kubeconfig flags of 10-kubeadm.conf,
  # the one thing the test changes about the packaged drop-in.
  printf '[Service]\nEnvironment="KUBELET_KUBECONFIG_ARGS="\n' >/etc/systemd/system/kubelet.service.d/20-standalone.conf
  cat >/etc/kubernetes/manifests/web.yaml <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: web
spec:
  hostNetwork: true
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: gantry.local/busybox:v1
    command: ["sh", "-c", "echo STARTED; exec sleep 3600"]
EOF
}

setup() {
  sed -i 's#sandbox_image = .*#sandbox_image = "gantry.local/pause:v1"#; s/SystemdCgroup = .*/SystemdCgroup = true/' \
    /etc/containerd/config.toml
  systemctl restart containerd
  wait_for 60 ctr version >/dev/null 2>&1 || return 1
  local t
  for t in $H/*.oci.tar; do ctr -n k8s.io images import "$t" >/dev/null || return 1; done
  go_packages || return 1
  kubeadm_files
  systemctl daemon-reload
  systemctl start kubelet
  log "setup done"
}

# The running kubelet.service's binary and command line.
service_process() {
  local pid
  pid=$(systemctl show -p MainPID --value kubelet)
  echo "active=$(systemctl is-active kubelet) exe=$(readlink /proc/$pid/exe 2>/dev/null) cmdline=$(tr '\0' ' ' </proc/$pid/cmdline 2>/dev/null)"
}
# The container of the static pod, once its log says it started.
pod_started() { grep -qs STARTED $POD_LOGS/default_web-pkg-node_*/main/0.log; }
web_container() { ctr -n k8s.io tasks ls 2>/dev/null | awk '$3 == "RUNNING" {print $1}' | sort | tr '\n' ' '; }
# Where a command name leads: the file behind its links, `go-stand-in` or `absent`.
resolved() {
  if [ ! -e "$1" ]; then echo absent
  elif grep -qs GO-KUBELET-STAND-IN "$1"; then echo go-stand-in
  else readlink -f "$1"; fi
}
layout() {
  echo "kubelet-path $(resolved /usr/bin/kubelet)"
  echo "kubectl-maintenance-path $(resolved /usr/bin/kubectl-maintenance)"
  echo "unit $(head -n1 /usr/lib/systemd/system/kubelet.service 2>/dev/null)"
  echo "dropin $(head -n1 /usr/lib/systemd/system/kubelet.service.d/10-kubeadm.conf 2>/dev/null)"
  echo "diversions $(dpkg-divert --list | grep -c 'by gantry')"
  local f
  for f in /var/lib/kubelet/config.yaml /var/lib/kubelet/kubeadm-flags.env /etc/default/kubelet \
           /etc/kubernetes/manifests/web.yaml; do
    echo "node-file $f $([ -s $f ] && echo kept || echo lost)"
  done
}

case_install() {
  local c=$R/install
  mkdir -p $c
  service_process >$c/before
  dpkg -i $H/gantry_*.deb >$c/dpkg.log 2>&1
  echo $? >$c/dpkg-exit
  layout >$c/layout
  systemctl cat kubelet >$c/unit 2>&1
  wait_for 120 pod_started || log "the static pod did not start"
  service_process >$c/service
  web_container >$c/containers
  /usr/bin/kubelet --version >$c/kubelet-version 2>&1
  kubectl-maintenance --help >$c/maintenance-help 2>&1
  # A restart of the agent leaves the pod's container running.
  local since
  since=$(date +%s)
  systemctl restart kubelet
  # The new agent has synced the pod once it reports the pod's phase.
  wait_for 90 sh -c "journalctl -u kubelet --since @$since -o cat | grep -q 'pod phase changed'" ||
    log "no pod sync after the restart"
  web_container >$c/containers-after-restart
  journalctl -u kubelet --no-pager -o cat >$c/journal
}

case_remove() {
  local c=$R/remove
  mkdir -p $c
  dpkg -r gantry >$c/dpkg.log 2>&1
  echo $? >$c/dpkg-exit
  layout >$c/layout
  wait_for 60 sh -c "systemctl show -p MainPID --value kubelet | xargs -I{} readlink /proc/{}/exe | grep -qv gantry"
  service_process >$c/service
  web_container >$c/containers
  dpkg --purge gantry >>$c/dpkg.log 2>&1
  layout >$c/layout-purged
}

# On a node without the Go kubelet's packages: install, run, remove.
case_fresh() {
  local c=$R/fresh
  mkdir -p $c
  systemctl stop kubelet
  dpkg --purge kubelet kubeadm >$c/dpkg.log 2>&1
  dpkg -i $H/gantry_*.deb >>$c/dpkg.log 2>&1
  echo $? >$c/dpkg-exit
  systemctl start kubelet
  layout >$c/layout
  wait_for 60 sh -c '[ "$(systemctl is-active kubelet)" = active ]'
  service_process >$c/service
  dpkg -r gantry >>$c/dpkg.log 2>&1
  echo $? >$c/remove-exit
  layout >$c/layout-removed
  echo "active=$(systemctl is-active kubelet)" >$c/service-removed
}

setup || exit 1
case_install
case_remove
case_fresh
log "done"
