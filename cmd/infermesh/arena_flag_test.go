package main

import "testing"

// TestMemoryArenaFlag: --memory-arena and SERVICE_MEMORY_ARENA take on,
// off or a positive duration (default 5m); anything else stops start-up.
func TestMemoryArenaFlag(t *testing.T) {
	for args, want := range map[string]string{"": "5m", "on": "on", "off": "off", "90s": "90s"} {
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
	for _, bad := range []string{"shrink", "0s", "-5m"} {
		cfg, err := parseServe(t, "--memory-arena", bad)
		if err != nil {
			t.Fatal(err)
		}
		if err := cfg.Validate(); err == nil {
			t.Errorf("--memory-arena %s was accepted", bad)
		}
	}
}
