// Package limits admits counted requests and accounts for their usage.
//
// A Limiter checks, per request: the client address's and the key's
// requests-per-minute (token buckets from golang.org/x/time/rate in bounded
// maps), the key's daily request quota (resets at midnight UTC) and its
// monthly budget of estimated cost (from a per-model price table; resets on
// the 1st, UTC). Refusals are 429 with a Retry-After computed from the
// bucket, the end of the day or the end of the month, and a message naming
// the limit.
//
// Quotas and budgets are exact across the cluster without an external
// store: the leader grants each node leases (slices of what remains)
// through raft, and a node admits only what its lease covers. The limiter
// follows the protocol written in consensus/DESIGN.md: one lease command
// per key and kind in flight; held and pending kept per account; renewal
// in the background before the holding runs dry and at half its TTL,
// synchronously when it is empty; consumption kept on any error and
// reported again; slices that shrink with what remains (and, in a ledger
// that many nodes hold part of, slices sized by this node's own demand,
// spare holdings returned within a second or two, and 503 rather than
// 429 while the rest is held elsewhere); idle holdings
// returned; a holding it cannot account for (left by an earlier run)
// treated as used; everything released on Drain. Cut off from the leader,
// a node serves only its unexpired holding and then answers 503
// quota_unavailable saying why (429 once the leader says nothing is left).
// The Leaser interface is that protocol's way to raft; ConsensusLeaser
// implements it over a consensus node.
//
// Usage (requests, tokens, cost and errors by app, model, key, serving
// worker and UTC day)
// is summed in memory and sent as one raft entry per second or per 256
// requests, one batch at a time, never one entry per request and never
// content.
//
// A Gate is the node's busy gate: an in-flight cap with priorities.
// X-Service-Priority can only lower a request to background or
// maintenance, and batch work runs as background (Request.Batch, and
// Gate.Wait for batch-job chunks). Background and maintenance work never
// take the slots reserved for interactive work; when every slot is taken,
// interactive work gets the next one; when the queue is full, an arrival
// sheds the newest waiter of a lower priority. It refuses with 503
// server_overloaded and a Retry-After from the queue depth, reports
// saturation for gossip, and counts waiting, admitted and shed requests
// by priority.
//
// Plans: a server on the Free plan (replicated, read through PlanSource)
// gives third-party callers (Classify: keys not of a first-party app,
// keyless callers whose User-Agent names a known tool) FreeDailyRequests
// requests a day across the mesh, leased from one reserved ledger like a
// key's daily quota, and FreeClientRPM a minute per client; refusals are
// 429 and Upgrade reports them, for X-Service-Upgrade: 1. First-party
// callers are exempt; Pro has no allowance.
package limits
