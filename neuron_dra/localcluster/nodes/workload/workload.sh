#!/bin/sh
# What a workload container sees, one `key=value` line each, then it waits until TERM (exits at once on it).
# The local cluster's demo and tests read these lines from the container's log.
trap 'echo "workload: TERM"; exit 0' TERM INT
devices=$(ls /dev | grep -E '^neuron[0-9]+$' | sort -t n -k 2 -n | tr '\n' ' ')
efa=$(ls /dev/infiniband 2>/dev/null | tr '\n' ' ')
echo "workload: devices=${devices% }"
echo "workload: NEURON_RT_VISIBLE_CORES=${NEURON_RT_VISIBLE_CORES:-}"
echo "workload: NEURON_LOGICAL_NC_CONFIG=${NEURON_LOGICAL_NC_CONFIG:-}"
echo "workload: NEURON_RT_VISIBLE_DEVICES=${NEURON_RT_VISIBLE_DEVICES:-}"
echo "workload: NEURON_RT_ULTRASERVER_MODE=${NEURON_RT_ULTRASERVER_MODE:-}"
echo "workload: NEURON_RT_ULTRASERVER_SERVER_ID=${NEURON_RT_ULTRASERVER_SERVER_ID:-}"
echo "workload: NEURON_RT_ULTRASERVER_NODE_ID=${NEURON_RT_ULTRASERVER_NODE_ID:-}"
echo "workload: efa=${efa% }"
echo "workload: ready=yes"
while :; do sleep 1 & wait $!; done
