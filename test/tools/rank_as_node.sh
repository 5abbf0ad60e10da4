#!/bin/sh
# Runs "$@" as a node of its own to NCCL: a distinct NCCL_HOSTID per MPI rank,
# so that ranks sharing one GPU (or one host) are separate nodes to NCCL and
# talk through its network transport.  How several nodes are emulated on one
# machine (docs/nccl_backend.md, "Limits").
rank=${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-0}}
NCCL_HOSTID=moe_ep_node_$rank
export NCCL_HOSTID
exec "$@"
