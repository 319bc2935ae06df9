package api

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/infermesh/infermesh/node/apierr"
)

// Governance is the replicated state behind the admin routes: keys, usage
// and the cluster's state digest. Writes go through raft on the node.
type Governance interface {
	// CreateKey stores a new key through raft and returns it with its
	// plaintext, which is shown this once and never stored.
	CreateKey(ctx context.Context, req KeyRequest) (KeyInfo, string, error)
	// Keys lists every stored key, revoked ones included, sorted by id.
	Keys() []KeyInfo
	// Key returns the key with this id; false when there is none.
	Key(id string) (KeyInfo, bool)
	// RevokeKey revokes a key for good through raft and returns it; an
	// unknown id wraps ErrNotFound.
	RevokeKey(ctx context.Context, id string) (KeyInfo, error)
	// Usage returns the replicated usage totals grouped by app, model, key
	// or worker, for the UTC days from since to until (both included; a
	// zero time leaves that end open); any other by is an error.
	Usage(by string, since, until time.Time) ([]UsageRow, error)
	// Policy returns the pool policy document (GET /v1/server/policy).
	Policy() Policy
	// SetPolicy checks p and replaces the whole pool policy with it
	// through raft, and returns the stored policy; an invalid document is
	// a 400 *APIError naming its field.
	SetPolicy(ctx context.Context, p Policy) (Policy, error)
	// StateDigest identifies this node's replicated state for convergence
	// checks.
	StateDigest() StateDigest
	// WaitApplied waits until this node's replica has applied the raft
	// log entry index (or ctx ends) and returns its applied index.
	WaitApplied(ctx context.Context, index uint64) (uint64, error)
}

// Governance errors the node returns; the admin routes map them to statuses.
var (
	// ErrNoLeader: the write could not reach a raft leader (503).
	ErrNoLeader = errors.New("no reachable leader for the write; retry shortly")
	// ErrNotFound: no such key (404).
	ErrNotFound = errors.New("not found")
	// ErrInvalid: the write was refused as invalid (400).
	ErrInvalid = errors.New("invalid")
)

// KeyRequest creates an API key.
type KeyRequest struct {
	// Name labels the key for operators; required, at most 128 characters.
	Name string `json:"name"`
	// App is the application the key belongs to (the group of usage by
	// app); at most 128 characters.
	App string `json:"app,omitempty"`
	// Admin lets the key use the admin routes.
	Admin bool `json:"admin,omitempty"`
	// Allow is the endpoint allowlist (chat, embeddings, images, audio,
	// vision, models, pull, usage), at most 32 entries; empty allows all.
	Allow []string `json:"allow,omitempty"`
	// RPM limits requests per minute; 0 means unlimited.
	RPM int64 `json:"rpm,omitempty"`
	// DailyQuota limits counted requests per UTC day; 0 means unlimited.
	DailyQuota int64 `json:"daily_quota,omitempty"`
	// MonthlyBudget limits the estimated cost per month, in the currency
	// units of the policy's model prices; 0 means unlimited.
	MonthlyBudget float64 `json:"monthly_budget,omitempty"`
	// ExpiresAt is when the key stops working, in Unix seconds; absent
	// (nil) never expires. A value must lie in the future.
	ExpiresAt *int64 `json:"expires_at,omitempty"`
}

// Upper bounds of key limits: far above any real use, low enough that a
// budget in micro-units and a quota count fit an int64 with room to add.
const (
	maxKeyRPM           = 1_000_000_000
	maxKeyDailyQuota    = 1_000_000_000_000
	maxKeyMonthlyBudget = 1e12
	maxKeyExpiry        = 253402300799 // 9999-12-31T23:59:59Z
)

// checkKeyRequest validates a key creation body field by field, naming the
// first bad field.
func checkKeyRequest(req *KeyRequest, now time.Time) *apierr.Error {
	switch {
	case req.Name == "":
		return apierr.BadRequest(apierr.CodeMissingParam, "name", "A key needs a name.")
	case len(req.Name) > 128 || len(req.App) > 128:
		return apierr.BadRequest(apierr.CodeInvalidValue, "name", "name and app are at most 128 characters.")
	case req.RPM < 0 || req.RPM > maxKeyRPM:
		return apierr.BadRequest(apierr.CodeInvalidValue, "rpm", fmt.Sprintf("rpm must be between 0 (unlimited) and %d.", maxKeyRPM))
	case req.DailyQuota < 0 || req.DailyQuota > maxKeyDailyQuota:
		return apierr.BadRequest(apierr.CodeInvalidValue, "daily_quota", fmt.Sprintf("daily_quota must be between 0 (unlimited) and %d.", int64(maxKeyDailyQuota)))
	case math.IsNaN(req.MonthlyBudget) || req.MonthlyBudget < 0 || req.MonthlyBudget > maxKeyMonthlyBudget:
		return apierr.BadRequest(apierr.CodeInvalidValue, "monthly_budget", "monthly_budget must be between 0 (unlimited) and 1e12.")
	case len(req.Allow) > 32:
		return apierr.BadRequest(apierr.CodeInvalidValue, "allow", "At most 32 allowlist entries.")
	case req.ExpiresAt != nil && (*req.ExpiresAt <= now.Unix() || *req.ExpiresAt > maxKeyExpiry):
		return apierr.BadRequest(apierr.CodeInvalidValue, "expires_at", "expires_at must be a Unix time in seconds in the future (omit it for a key that never expires).")
	}
	return nil
}

// KeyInfo describes a stored key; the plaintext is never part of it.
type KeyInfo struct {
	// ID is the key's stable id ("key_" and 16 hex digits), used in
	// /v1/server/keys/{id}.
	ID string `json:"id"`
	// Object is always "api_key".
	Object string `json:"object"`
	// Name labels the key for operators.
	Name string `json:"name"`
	// App is the application the key belongs to.
	App string `json:"app"`
	// Admin reports whether the key may use the admin routes.
	Admin bool `json:"admin"`
	// Allow is the endpoint allowlist; empty (never null) allows all.
	Allow []string `json:"allow"`
	// RPM is the requests-per-minute limit; 0 means unlimited.
	RPM int64 `json:"rpm"`
	// DailyQuota is the limit of counted requests per UTC day; 0 means
	// unlimited.
	DailyQuota int64 `json:"daily_quota"`
	// MonthlyBudget is the estimated-cost limit per month, in the policy's
	// price units; 0 means unlimited.
	MonthlyBudget float64 `json:"monthly_budget"`
	// ExpiresAt is the expiry in Unix seconds; nil (null) never expires.
	ExpiresAt *int64 `json:"expires_at"`
	// CreatedAt is when the key was created, in Unix seconds.
	CreatedAt int64 `json:"created_at"`
	// Revoked reports whether the key was revoked (for good).
	Revoked bool `json:"revoked"`
}

func governanceError(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, ErrNoLeader):
		e := apierr.New(http.StatusServiceUnavailable, apierr.TypeServer, apierr.CodeNoLeader, "", err.Error())
		e.RetryAfter = 2
		apierr.Write(w, e)
	case errors.Is(err, ErrNotFound):
		apierr.Write(w, apierr.New(http.StatusNotFound, apierr.TypeInvalidRequest, apierr.CodeKeyNotFound, "id", err.Error()))
	case errors.Is(err, ErrInvalid):
		apierr.Write(w, apierr.BadRequest(apierr.CodeInvalidValue, "", err.Error()))
	default:
		writeErr(w, err)
	}
}

func (s *Server) adminRoutes(r chi.Router) {
	if s.opt.Governance == nil {
		return
	}
	r.Post("/server/keys", s.createKey)
	r.Get("/server/keys", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": s.opt.Governance.Keys()})
	})
	r.Get("/server/keys/{id}", func(w http.ResponseWriter, r *http.Request) {
		id, _ := url.PathUnescape(chi.URLParam(r, "id"))
		k, ok := s.opt.Governance.Key(id)
		if !ok {
			governanceError(w, fmt.Errorf("no key %q: %w", id, ErrNotFound))
			return
		}
		writeJSON(w, http.StatusOK, k)
	})
	r.Delete("/server/keys/{id}", func(w http.ResponseWriter, r *http.Request) {
		id, _ := url.PathUnescape(chi.URLParam(r, "id"))
		k, err := s.opt.Governance.RevokeKey(r.Context(), id)
		if err != nil {
			governanceError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, k)
	})
	r.Get("/server/usage", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		by := q.Get("by")
		if by == "" {
			by = "app"
		}
		var days [2]time.Time
		for i, name := range []string{"since", "until"} {
			if v := q.Get(name); v != "" {
				d, err := time.Parse(time.DateOnly, v)
				if err != nil {
					apierr.Write(w, apierr.BadRequest(apierr.CodeInvalidValue, name, fmt.Sprintf("'%s' must be a UTC day, YYYY-MM-DD.", name)))
					return
				}
				days[i] = d
			}
		}
		if !days[0].IsZero() && !days[1].IsZero() && days[1].Before(days[0]) {
			apierr.Write(w, apierr.BadRequest(apierr.CodeInvalidValue, "until", "'until' is before 'since'."))
			return
		}
		rows, err := s.opt.Governance.Usage(by, days[0], days[1])
		if err != nil {
			apierr.Write(w, apierr.BadRequest(apierr.CodeInvalidValue, "by", "'by' must be one of app, model, key, worker."))
			return
		}
		writeJSON(w, http.StatusOK, UsageReport{By: by, Data: rows, Object: "list", Since: q.Get("since"), Until: q.Get("until")})
	})
	if s.opt.AuditExport != nil {
		r.Get("/server/audit", s.opt.AuditExport.ServeHTTP)
		r.Get("/server/audit/keys", s.opt.AuditKeys.ServeHTTP)
	}
	r.Get("/server/policy", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, s.opt.Governance.Policy())
	})
	r.Put("/server/policy", func(w http.ResponseWriter, r *http.Request) {
		body, err := readBody(r, MaxJSONBody)
		if err != nil {
			writeErr(w, err)
			return
		}
		var doc Policy
		if err := decodeStrict(body, &doc); err != nil {
			governanceError(w, err)
			return
		}
		p, err := s.opt.Governance.SetPolicy(r.Context(), doc)
		if err != nil {
			governanceError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, p)
	})
	s.raftAdminRoutes(r)
	r.Get("/server/state-digest", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, s.opt.Governance.StateDigest())
	})
}

func (s *Server) createKey(w http.ResponseWriter, r *http.Request) {
	body, err := readBody(r, MaxJSONBody)
	if err != nil {
		writeErr(w, err)
		return
	}
	var req KeyRequest
	if err := decodeStrict(body, &req); err != nil {
		writeErr(w, err)
		return
	}
	if e := checkKeyRequest(&req, s.opt.Clock()); e != nil {
		apierr.Write(w, e)
		return
	}
	info, key, err := s.opt.Governance.CreateKey(r.Context(), req)
	if err != nil {
		governanceError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, struct {
		KeyInfo
		Key string `json:"key"`
	}{info, key})
}

// StateDigest is the body of GET /v1/server/state-digest: what identifies
// a node's replicated state, for convergence checks. Its fields are in the
// order the keys are sent.
type StateDigest struct {
	// AppliedIndex is the raft index the digest was taken at.
	AppliedIndex uint64 `json:"applied_index"`
	// Digest is a hash of the replicated state.
	Digest string `json:"digest"`
	// IsLeader reports whether this node leads the raft group.
	IsLeader bool `json:"is_leader"`
	// Leader is the leader this node follows ("" when none is known).
	Leader string `json:"leader"`
	// NodeID is the node that answered.
	NodeID string `json:"node_id"`
}
