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
// reported again; slices that shrink with what remains; idle holdings
// returned; a holding it cannot account for (left by an earlier run)
// treated as used; everything released on Drain. Cut off from the leader,
// a node serves only its unexpired holding and then answers 503
// quota_unavailable saying why (429 once the leader says nothing is left).
// The Leaser interface is that protocol's way to raft; ConsensusLeaser
// implements it over a consensus node.
//
// Usage (requests, tokens, estimated cost and errors by app, model and key)
// is summed in memory and sent as one raft entry per second or per 256
// requests, one batch at a time, never one entry per request and never
// content.
//
// A Gate is an in-flight cap with priorities: X-Service-Priority can only
// lower a request to background or maintenance, and when every slot is
// taken interactive work gets the next one. It refuses with 503 and a
// Retry-After from the queue depth when the queue is full or the wait too
// long, and reports saturation for gossip.
package limits
