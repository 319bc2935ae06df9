package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/infermesh/infermesh/node"
	"github.com/infermesh/infermesh/node/legacy"
)

// providerLegacyFlags binds the upstream-provider and legacy-API flags.
func providerLegacyFlags(f *envFlags, cfg *node.Config) {
	f.String(&cfg.ProvidersFile, "providers", "SERVICE_PROVIDERS", cfg.ProvidersFile, "JSON file of upstream OpenAI-compatible providers and their allowed models")

	ll := &legacyListen{p: &cfg.Legacy.Listen}
	if v, ok := f.env("SERVICE_LEGACY_LISTEN"); ok {
		if err := ll.Set(v); err != nil {
			f.errs = append(f.errs, fmt.Sprintf("SERVICE_LEGACY_LISTEN=%q: %v", v, err))
		}
	}
	f.fs.Var(ll, "legacy-listen", "serve the legacy (Ollama-shaped) API on this address; alone: "+legacy.DefaultListen+" (SERVICE_LEGACY_LISTEN)")
	f.rows = append(f.rows, [3]string{"legacy-listen", "SERVICE_LEGACY_LISTEN", "legacy API address"})

	f.Bool(&cfg.Legacy.AllowPull, "legacy-allow-pull", "SERVICE_LEGACY_ALLOW_PULL", cfg.Legacy.AllowPull, "let keyless legacy API callers make the node download models with /api/pull")
	f.Bool(&cfg.Legacy.AllowRemote, "legacy-allow-remote", "SERVICE_LEGACY_ALLOW_REMOTE", cfg.Legacy.AllowRemote, "let the legacy API serve callers on other computers")

	ed := &endDate{p: &cfg.Legacy.EndDate}
	if v, ok := f.env("SERVICE_LEGACY_END_DATE"); ok {
		if err := ed.Set(v); err != nil {
			f.errs = append(f.errs, fmt.Sprintf("SERVICE_LEGACY_END_DATE=%q: %v", v, err))
		}
	}
	f.fs.Var(ed, "legacy-end-date", "last day (YYYY-MM-DD, UTC) the legacy API serves; later calls answer 410 (SERVICE_LEGACY_END_DATE)")
	f.rows = append(f.rows, [3]string{"legacy-end-date", "SERVICE_LEGACY_END_DATE", "legacy API end date"})
}

// legacyListen is --legacy-listen: an address, or alone (a boolean flag)
// the default address; "false" turns it off.
type legacyListen struct{ p *string }

// String shows the current address.
func (l *legacyListen) String() string {
	if l == nil || l.p == nil {
		return ""
	}
	return *l.p
}

// Set takes an address, or a boolean.
func (l *legacyListen) Set(v string) error {
	if b, err := parseBool(v); err == nil {
		*l.p = ""
		if b {
			*l.p = legacy.DefaultListen
		}
		return nil
	}
	if !strings.Contains(v, ":") {
		return fmt.Errorf("want host:port, or 1/0")
	}
	*l.p = v
	return nil
}

// IsBoolFlag lets --legacy-listen stand alone.
func (l *legacyListen) IsBoolFlag() bool { return true }

// endDate is --legacy-end-date.
type endDate struct{ p *time.Time }

// String shows the date.
func (d *endDate) String() string {
	if d == nil || d.p == nil || d.p.IsZero() {
		return legacy.DefaultEndDate().Format(time.DateOnly)
	}
	return d.p.Format(time.DateOnly)
}

// Set parses YYYY-MM-DD.
func (d *endDate) Set(v string) error {
	t, err := time.Parse(time.DateOnly, v)
	if err != nil {
		return fmt.Errorf("want a date YYYY-MM-DD")
	}
	*d.p = t
	return nil
}

// joinLegacyListen rewrites "--legacy-listen ADDR" into
// "--legacy-listen=ADDR": the flag may stand alone, so the flag package
// would not take the next argument as its value. serve takes no
// positional arguments, so a following word that is not a flag is the
// address.
func joinLegacyListen(args []string) []string {
	out := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		a := args[i]
		if (a == "--legacy-listen" || a == "-legacy-listen") && i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") {
			out = append(out, a+"="+args[i+1])
			i++
			continue
		}
		if a == "--" {
			out = append(out, args[i:]...)
			break
		}
		out = append(out, a)
	}
	return out
}
