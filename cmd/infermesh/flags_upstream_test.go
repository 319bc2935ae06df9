package main

import (
	"strings"
	"testing"
	"time"

	"github.com/infermesh/infermesh/node"
)

func parseServe(t *testing.T, args ...string) (node.Config, error) {
	t.Helper()
	cfg := node.Defaults()
	level := "info"
	f := serveFlags(&cfg, &level)
	f.fs.SetOutput(&strings.Builder{})
	err := f.Parse(joinLegacyListen(args))
	return cfg, err
}

func TestLegacyAndProviderFlags(t *testing.T) {
	cases := []struct {
		args   []string
		listen string
	}{
		{nil, ""},
		{[]string{"--legacy-listen"}, "127.0.0.1:11434"},
		{[]string{"--legacy-listen", "--listen", "127.0.0.1:1"}, "127.0.0.1:11434"},
		{[]string{"--legacy-listen", "0.0.0.0:11434"}, "0.0.0.0:11434"},
		{[]string{"-legacy-listen=127.0.0.2:9"}, "127.0.0.2:9"},
		{[]string{"--legacy-listen=false"}, ""},
	}
	for _, c := range cases {
		cfg, err := parseServe(t, c.args...)
		if err != nil || cfg.Legacy.Listen != c.listen {
			t.Errorf("%q: listen %q, %v; want %q", c.args, cfg.Legacy.Listen, err, c.listen)
		}
	}
	cfg, err := parseServe(t, "--providers", "p.json", "--legacy-allow-remote", "--legacy-end-date", "2027-03-01")
	if err != nil || cfg.ProvidersFile != "p.json" || !cfg.Legacy.AllowRemote || !cfg.Legacy.EndDate.Equal(time.Date(2027, 3, 1, 0, 0, 0, 0, time.UTC)) {
		t.Errorf("flags: %+v %v", cfg.Legacy, err)
	}
	if _, err := parseServe(t, "--legacy-end-date", "31/12/2026"); err == nil {
		t.Error("a bad end date was accepted")
	}

	t.Setenv("SERVICE_LEGACY_LISTEN", "on")
	t.Setenv("SERVICE_PROVIDERS", "/etc/providers.json")
	t.Setenv("SERVICE_LEGACY_END_DATE", "2026-06-01")
	cfg, err = parseServe(t)
	if err != nil || cfg.Legacy.Listen != "127.0.0.1:11434" || cfg.ProvidersFile != "/etc/providers.json" || cfg.Legacy.EndDate.Month() != time.June {
		t.Errorf("environment: %+v %q %v", cfg.Legacy, cfg.ProvidersFile, err)
	}
	cfg, err = parseServe(t, "--legacy-listen", "127.0.0.3:5")
	if err != nil || cfg.Legacy.Listen != "127.0.0.3:5" {
		t.Errorf("the flag should win over the variable: %q %v", cfg.Legacy.Listen, err)
	}
	t.Setenv("SERVICE_LEGACY_LISTEN", "nowhere")
	if _, err := parseServe(t); err == nil || !strings.Contains(err.Error(), "SERVICE_LEGACY_LISTEN") {
		t.Errorf("bad variable: %v", err)
	}
}
