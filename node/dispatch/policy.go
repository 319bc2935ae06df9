package dispatch

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"sync/atomic"

	"github.com/infermesh/infermesh/consensus/routing"
	"github.com/infermesh/infermesh/mesh/route"
)

// Policy is the pool's routing policy: the strategy and per-node settings
// that override what each node gossips about itself.
type Policy struct {
	// Strategy orders candidates; empty means route.DefaultStrategy.
	Strategy route.Strategy `json:"strategy"`
	// Nodes holds per-node settings by node id. A node with an entry is
	// routed with the entry's weight and canary settings (and its cap when
	// set) instead of the ones it gossips.
	Nodes map[string]routing.Node `json:"nodes,omitempty"`
}

// Validate checks the policy's values.
func (p Policy) Validate() error {
	if p.Strategy != "" {
		if _, err := route.ParseStrategy(string(p.Strategy)); err != nil {
			return err
		}
	}
	for id, n := range p.Nodes {
		if n.CanaryPercent < 0 || n.CanaryPercent > 100 {
			return fmt.Errorf("dispatch: policy for %s: canary_percent %d is outside 0-100", id, n.CanaryPercent)
		}
		if n.Weight < 0 || n.InflightCap < 0 {
			return fmt.Errorf("dispatch: policy for %s: negative weight or inflight_cap", id)
		}
	}
	return nil
}

// PolicySource supplies the current policy. Dispatch calls it on every
// request, so it must be cheap. StaticPolicy is the flag- or file-based
// source; replicated state can implement it later without changes here.
type PolicySource interface {
	// Policy returns the policy in force now; its Nodes map is shared and
	// must not be modified.
	Policy() Policy
}

// StaticPolicy is a PolicySource that holds a policy set from flags or a
// policy file; Set replaces it (for example on SIGHUP).
type StaticPolicy struct {
	p atomic.Pointer[Policy]
}

// NewStaticPolicy validates p and returns a source that serves it.
func NewStaticPolicy(p Policy) (*StaticPolicy, error) {
	s := &StaticPolicy{}
	if err := s.Set(p); err != nil {
		return nil, err
	}
	return s, nil
}

// Policy returns the current policy.
func (s *StaticPolicy) Policy() Policy { return *s.p.Load() }

// Set validates and installs a new policy.
func (s *StaticPolicy) Set(p Policy) error {
	if err := p.Validate(); err != nil {
		return err
	}
	if p.Strategy == "" {
		p.Strategy = route.DefaultStrategy
	} else {
		p.Strategy, _ = route.ParseStrategy(string(p.Strategy))
	}
	s.p.Store(&p)
	return nil
}

// ParsePolicy reads a policy from JSON, for example:
//
//	{"strategy": "weighted",
//	 "nodes": {"n1": {"weight": 3}, "n2": {"weight": 1, "canary": true, "canary_percent": 10, "inflight_cap": 8}}}
//
// Unknown fields are errors.
func ParsePolicy(data []byte) (Policy, error) {
	var p Policy
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		return Policy{}, fmt.Errorf("dispatch: policy: %w", err)
	}
	return p, p.Validate()
}

// LoadPolicyFile reads a JSON policy file (see ParsePolicy).
func LoadPolicyFile(path string) (*StaticPolicy, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("dispatch: policy file: %w", err)
	}
	p, err := ParsePolicy(data)
	if err != nil {
		return nil, err
	}
	return NewStaticPolicy(p)
}
