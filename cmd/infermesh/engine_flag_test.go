package main

import (
	"testing"

	"github.com/infermesh/infermesh/node"
)

// TestEngineFlag: --engine and SERVICE_ENGINE take local (default) and
// gateway; anything else stops start-up with a message naming it.
func TestEngineFlag(t *testing.T) {
	for args, want := range map[string]string{"": "local", "local": "local", "gateway": "gateway"} {
		var a []string
		if args != "" {
			a = []string{"--engine", args}
		}
		cfg, err := parseServe(t, a...)
		if err != nil || cfg.Engine != want || cfg.Validate() != nil {
			t.Errorf("--engine %q: %q %v %v", args, cfg.Engine, err, cfg.Validate())
		}
	}
	t.Setenv("SERVICE_ENGINE", "gateway")
	if cfg, err := parseServe(t); err != nil || cfg.Engine != node.EngineGateway {
		t.Errorf("SERVICE_ENGINE=gateway: %q %v", cfg.Engine, err)
	}
	cfg, err := parseServe(t, "--engine", "cloud")
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err == nil {
		t.Error("--engine cloud was accepted")
	}
}
