package main

import "testing"

// TestMemoryArenaFlag: --memory-arena and SERVICE_MEMORY_ARENA take on
// (default) and off; anything else stops start-up.
func TestMemoryArenaFlag(t *testing.T) {
	for args, want := range map[string]string{"": "on", "on": "on", "off": "off"} {
		var a []string
		if args != "" {
			a = []string{"--memory-arena", args}
		}
		cfg, err := parseServe(t, a...)
		if err != nil || cfg.MemoryArena != want || cfg.Validate() != nil {
			t.Errorf("--memory-arena %q: %q %v %v", args, cfg.MemoryArena, err, cfg.Validate())
		}
	}
	t.Setenv("SERVICE_MEMORY_ARENA", "off")
	if cfg, err := parseServe(t); err != nil || cfg.MemoryArena != "off" {
		t.Errorf("SERVICE_MEMORY_ARENA=off: %q %v", cfg.MemoryArena, err)
	}
	cfg, err := parseServe(t, "--memory-arena", "shrink")
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err == nil {
		t.Error("--memory-arena shrink was accepted")
	}
}
