#!/bin/sh
# podshim's main job: a real pod sandbox lifecycle with crictl's verbs, on built-in defaults
# (state in /var/lib/podshim, sockets in /run/podshim). The pod gets its own network namespace
# with loopback only: no CNI config is used, so nothing touches this machine's network.
# Run as root after `.ci/install` (it links podshimctl and podshim into /usr/local/bin). It leaves
# nothing behind, and says so.
set -eu
cd "$(dirname "$0")"
command -v podshimctl >/dev/null || { echo "quickstart: no podshimctl on PATH: run .ci/install first" >&2; exit 1; }
ctl() { PODSHIM_CNI_CONF_DIR="$nocni" podshimctl "$@"; }
nocni=$(mktemp -d /tmp/podshim-quickstart-nocni.XXXXXX)
pod=""
cleanup() {
    if [ -n "$pod" ]; then ctl rmp "$pod" >/dev/null 2>&1 || true; fi
    rm -rf "$nocni"
}
trap cleanup EXIT INT TERM

echo "== runp: a pod from examples/pod-config.json"
pod=$(ctl runp pod-config.json)
echo "$pod"

echo "== create + start: a container that shows the pod's hostname and interfaces"
ctr=$(ctl create "$pod" container-config.json pod-config.json)
ctl start "$ctr"
# The container runs briefly; wait until it has exited.
for _ in $(seq 1 100); do
    ctl ps -a --pod "$pod" --state exited -q | grep -q "$ctr" && break
    sleep 0.05
done

echo "== logs: what the container printed (hostname, then its interfaces: only the pod's lo)"
ctl logs "$ctr"

echo "== pods / ps"
ctl pods
ctl ps -a

echo "== the container shared the pause's network namespace:"
pause_pid=$(ctl inspectp --json "$pod" | python3 -c 'import json,sys; print(json.load(sys.stdin)["info"]["pid"])')
netns=$(ctl inspectp --json "$pod" | python3 -c 'import json,sys; print(json.load(sys.stdin)["info"]["netns_path"])')
echo "pause pid $pause_pid, net namespace $(readlink /proc/"$pause_pid"/ns/net), pinned at $netns"

echo "== stopp + rmp"
ctl stopp "$pod"
ctl rmp "$pod"
pod=""

echo "== nothing left behind:"
left=0
[ -e "$netns" ] && { echo "netns $netns is still there"; left=1; }
[ -d "/proc/$pause_pid" ] && grep -q catatonit "/proc/$pause_pid/cmdline" 2>/dev/null && { echo "pause $pause_pid still runs"; left=1; }
[ -n "$(ctl pods -q)" ] && { echo "pods are still listed"; left=1; }
[ "$left" = 0 ] && echo "no pod, no pause, no netns, no shim."
exit "$left"
