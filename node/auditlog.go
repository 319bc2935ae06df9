package node

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"time"

	"github.com/infermesh/infermesh/consensus"
	"github.com/infermesh/infermesh/node/api"
	"github.com/infermesh/infermesh/node/audit"
	"github.com/infermesh/infermesh/node/auth"
)

// AuditConfig configures the signed audit log (node/audit): one record per
// counted request, written under <data-dir>/audit.
type AuditConfig struct {
	// Enabled writes audit records (default on).
	Enabled bool
	// Retention removes files whose last record is older (default 90
	// days; 0 keeps them by age).
	Retention time.Duration
	// MaxFiles keeps at most this many files (default 1000; 0: no limit).
	MaxFiles int
	// MaxFileBytes starts a new file beyond this size (default 64 MiB).
	MaxFileBytes int64
	// SyncInterval is the fsync policy: 0 after every batch of records,
	// > 0 at most once per interval (default 1s: records are written
	// after the response anyway, and a sync per batch cost 3-4 % of
	// throughput), < 0 only at rotation and shutdown.
	SyncInterval time.Duration
}

func (c AuditConfig) validate() []error {
	if c.Retention < 0 || c.MaxFiles < 0 || c.MaxFileBytes < 0 {
		return []error{fmt.Errorf("audit retention %s, max files %d, max file bytes %d: must not be negative", c.Retention, c.MaxFiles, c.MaxFileBytes)}
	}
	if c.MaxFileBytes != 0 && c.MaxFileBytes < 64<<10 {
		return []error{fmt.Errorf("audit max file bytes %d: want at least 64 KiB", c.MaxFileBytes)}
	}
	return nil
}

// openAudit opens the audit log when enabled (after the data-dir lock).
func (n *Node) openAudit() error {
	if !n.cfg.Audit.Enabled {
		return nil
	}
	key, err := audit.LoadOrCreateKey(filepath.Join(n.cfg.DataDir, audit.KeyFileName))
	if err != nil {
		return fmt.Errorf("audit key: %w", err)
	}
	c := n.cfg.Audit
	l, err := audit.Open(filepath.Join(n.cfg.DataDir, audit.DirName), audit.Options{
		NodeID: n.cfg.NodeID, Key: key, MaxFileBytes: c.MaxFileBytes, MaxAge: c.Retention, MaxFiles: c.MaxFiles,
		SyncInterval: c.SyncInterval, Logger: n.log, Clock: n.clock,
	})
	if err != nil {
		return fmt.Errorf("audit log (move %s aside to start a new chain): %w", filepath.Join(n.cfg.DataDir, audit.DirName), err)
	}
	n.reg.MustRegister(l.Collectors()...)
	n.audit = l
	return nil
}

// auditRequest records in log (nil: off) one counted request that ended
// with s.
func auditRequest(log *audit.Log, clock func() time.Time, r *http.Request, model string, start time.Time, s api.Served) {
	if log == nil {
		return
	}
	rec := audit.Record{Time: start, Endpoint: r.URL.Path, Model: model, Worker: s.Backend, Status: s.Status,
		Duration: clock().Sub(start), RequestID: api.RequestID(r.Context())}
	if c, ok := auth.CallerFrom(r.Context()); ok {
		rec.KeyID, rec.App = c.KeyID, c.App
	}
	log.Append(rec)
}

// publishAuditKey stores this node's audit public key in the replicated
// state (once the cluster has a leader), so verification uses keys the
// mesh agreed on.
func (n *Node) publishAuditKey(ctx context.Context) {
	if n.audit == nil {
		return
	}
	pub := n.audit.PublicKey()
	if have, ok := n.cluster.raft.State().AuditKeys()[n.cfg.NodeID]; ok && have.Equal(pub) {
		return
	}
	cmd, err := consensus.SetAuditKey(n.cfg.NodeID, pub)
	if err == nil {
		_, err = n.cluster.raft.Apply(ctx, cmd)
	}
	if err != nil {
		n.log.Warn("could not publish the audit public key; verification needs --keys until it is", "err", err)
	}
}

// AuditKeys implements audit.KeyDirectory over the replicated state.
func (n *Node) AuditKeys() map[string]ed25519.PublicKey {
	return n.cluster.raft.State().AuditKeys()
}

// exportAudit writes this node's records since q.Since, then (unless
// q.Local) every other member's, fetched from its client port with the
// caller's credentials. Each node's chain verifies on its own, so the
// concatenation verifies.
func (n *Node) exportAudit(ctx context.Context, q audit.Query, w io.Writer, authorization string) error {
	if n.audit == nil {
		return errors.New("audit records are off on this node (--audit=false)")
	}
	if err := n.audit.Flush(ctx); err != nil {
		return err
	}
	if err := n.audit.ExportContext(ctx, q.Since, w); err != nil || q.Local {
		return err
	}
	scheme := "http"
	if n.tls != nil && n.tls.client != nil {
		scheme = "https"
	}
	client := &http.Client{Timeout: 5 * time.Minute}
	for _, m := range n.backend.Members() {
		if m.Self || m.HTTPAddr == "" || m.State == "dead" || m.State == "left" {
			continue
		}
		u := url.URL{Scheme: scheme, Host: m.HTTPAddr, Path: "/v1/server/audit", RawQuery: url.Values{"local": {"1"}, "since": {q.Since.UTC().Format(time.RFC3339Nano)}}.Encode()}
		if q.Since.IsZero() {
			u.RawQuery = "local=1"
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
		if err != nil {
			return err
		}
		if authorization != "" {
			req.Header.Set("Authorization", authorization)
		}
		resp, err := client.Do(req)
		if err != nil {
			return fmt.Errorf("audit records of %s: %w", m.ID, err)
		}
		if resp.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			resp.Body.Close()
			return fmt.Errorf("audit records of %s: %d %s", m.ID, resp.StatusCode, strings.TrimSpace(audit.ErrorMessage(b)))
		}
		_, err = io.Copy(w, resp.Body)
		resp.Body.Close()
		if err != nil {
			return fmt.Errorf("audit records of %s: %w", m.ID, err)
		}
	}
	return nil
}

// auditHandlers are the admin routes GET /v1/server/audit and
// /v1/server/audit/keys (nil when audit is off).
func (n *Node) auditHandlers() (export, keys http.Handler) {
	if !n.cfg.Audit.Enabled {
		return nil, nil
	}
	exp := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		audit.ExportHandler(func(ctx context.Context, q audit.Query, out io.Writer) error {
			return n.exportAudit(ctx, q, out, r.Header.Get("Authorization"))
		})(w, r)
	})
	return exp, audit.KeysHandler(n)
}

// ensureReplicated publishes what this node contributes to the replicated
// state once there is a leader: its audit public key and, on a mesh
// without a plan, the plan of its flags.
func (n *Node) ensureReplicated() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := n.cluster.raft.WaitForLeader(ctx); err != nil {
		n.log.Warn("no raft leader; audit key and plan not published", "err", err)
		return
	}
	n.publishAuditKey(ctx)
	n.seedPlan(ctx)
}
