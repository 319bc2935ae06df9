// Package consensus is the replicated governance state of an infermesh
// cluster: API keys (stored by hash only), pool policy (with the plan and
// first-party applications), quota and budget leases (and the Free plan's
// reserved plan:free ledger), usage totals by worker and UTC day, and the
// nodes' audit public keys, kept by a hashicorp/raft group with
// raft-boltdb/v2 log and stable stores and file snapshots under the node's
// data directory.
//
// Writes go through Node.Apply on any node: the leader appends to the raft
// log; a follower forwards to the leader over ConsensusService (Connect,
// each call signed by mesh/peerauth with a key derived from the cluster
// secret) and gets the applied result back.
// Reads come from the local copy through Node.State.
//
// Membership follows the node's mesh: the node reports joins, failures and
// departures (MemberJoined, MemberFailed, MemberLeft) and supplies a
// MemberSource; the leader reconciles raft's configuration against them.
//
// Raft and Connect share one internal port through package rpcmux. Package
// consensustest runs in-process clusters for tests. See DESIGN.md.
package consensus
