package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/infermesh/infermesh/mesh/forward"
	"github.com/infermesh/infermesh/mesh/route"
	"github.com/infermesh/infermesh/node/api"
)

// An admin write (key create or revoke, policy set) is committed by the
// raft leader; the answering node, when it is a follower, applies the entry
// only when the leader's next append tells it the commit index (up to two
// commit timeouts later, 70-90 ms measured). So that a write is visible on
// the node that answered, the call returns only once that node applied it
// (bounded by writeVisibleWait). A revoke also waits for every other live
// node of the mesh (barrier read through the peer-only api.AppliedPath
// route, bounded by revokePeerWait): when it returns, every node that
// answered the barrier refuses the key. A node that is unreachable or
// slower than the bound (it is partitioned, or restarting) may accept the
// key until it catches up; its /readyz says not_ready meanwhile when it
// has no leader.
const (
	writeVisibleWait = 5 * time.Second
	revokePeerWait   = 2 * time.Second
)

// WaitApplied waits until this node's replica has applied index or ctx
// ends, and returns the applied index.
func (n *governance) WaitApplied(ctx context.Context, index uint64) (uint64, error) {
	c := n.cluster
	if c.raft == nil {
		return 0, errors.New("raft is not running on this node")
	}
	t := time.NewTicker(2 * time.Millisecond)
	defer t.Stop()
	for {
		applied := c.raft.State().AppliedIndex()
		if applied >= index {
			return applied, nil
		}
		select {
		case <-ctx.Done():
			return applied, fmt.Errorf("applied index %d, waiting for %d: %w", applied, index, ctx.Err())
		case <-t.C:
		}
	}
}

// writeVisible waits (bounded) until this node has applied the entry of
// an admin write; with everywhere, every live peer too. Failures are
// logged: the write itself is committed.
func (n *governance) writeVisible(ctx context.Context, index uint64, everywhere bool) {
	if index == 0 {
		return
	}
	var wg sync.WaitGroup
	if everywhere {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if late := n.waitPeersApplied(ctx, index, revokePeerWait); len(late) > 0 {
				n.log.Warn("admin write not confirmed applied on every node in time", "index", index, "nodes", late)
			}
		}()
	}
	wctx, cancel := context.WithTimeout(ctx, writeVisibleWait)
	defer cancel()
	if _, err := n.WaitApplied(wctx, index); err != nil {
		n.log.Warn("admin write not applied here in time", "index", index, "err", err)
	}
	wg.Wait()
}

// waitPeersApplied asks every live peer, at once, to wait until it has
// applied index (at most bound) and returns the ids that did not confirm.
func (n *governance) waitPeersApplied(ctx context.Context, index uint64, bound time.Duration) []string {
	c := n.cluster
	if c.mesh == nil || c.fwdCli == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, bound+500*time.Millisecond)
	defer cancel()
	var (
		mu   sync.Mutex
		late []string
		wg   sync.WaitGroup
	)
	path := api.AppliedPath + "?index=" + strconv.FormatUint(index, 10) + "&wait_ms=" + strconv.FormatInt(bound.Milliseconds(), 10)
	for _, p := range c.mesh.Peers() {
		if p.Self || p.RPCAddr == "" || p.Health == route.HealthUnknown {
			continue
		}
		wg.Add(1)
		go func(id, addr string) {
			defer wg.Done()
			if err := n.peerApplied(ctx, addr, path); err != nil {
				mu.Lock()
				late = append(late, id+": "+err.Error())
				mu.Unlock()
			}
		}(p.ID, p.RPCAddr)
	}
	wg.Wait()
	return late
}

// peerApplied runs one barrier read on a peer.
func (n *governance) peerApplied(ctx context.Context, addr, path string) error {
	s, err := n.cluster.fwdCli.Forward(ctx, addr, &forward.Request{Method: http.MethodGet, Path: path, Header: http.Header{}, Unary: true})
	if err != nil {
		return err
	}
	defer s.Close()
	h, err := s.Head()
	if err != nil {
		return err
	}
	for {
		if _, _, err := s.Next(); err != nil {
			if !errors.Is(err, io.EOF) {
				return err
			}
			break
		}
	}
	if h.Status != http.StatusOK {
		return fmt.Errorf("status %d", h.Status)
	}
	return nil
}
