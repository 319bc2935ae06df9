package node

import (
	"context"
	"log/slog"
	"maps"
)

// nodeLogger scopes l to the node: every line carries node=<id> once.
// The node's parts (consensus, mesh, forward, dispatch, transfer) also add
// node=<id> to the logger they are given, so that they name their node
// when used alone; under the node those copies are dropped rather than
// printed twice (a repeated key also makes an ambiguous JSON object).
func nodeLogger(l *slog.Logger, id string) *slog.Logger {
	return slog.New(&dedupHandler{h: l.Handler()}).With("node", id)
}

// dedupHandler drops an attribute added with With when the logger already
// carries the same key with the same value, and renames a record's
// attribute whose key the logger already carries: it becomes
// "<component>.<key>" (or "arg.<key>" without a component), so raft's
// node="Node at … [Leader]" reads raft.node=… next to node=<id>.
type dedupHandler struct {
	h     slog.Handler
	attrs map[string]slog.Value // top-level attributes added with With
	group bool                  // a group is open: keys are no longer top-level
}

// Enabled defers to the wrapped handler.
func (d *dedupHandler) Enabled(ctx context.Context, l slog.Level) bool { return d.h.Enabled(ctx, l) }

// Handle renames record attributes that clash with the logger's own.
func (d *dedupHandler) Handle(ctx context.Context, r slog.Record) error {
	if d.group || len(d.attrs) == 0 {
		return d.h.Handle(ctx, r)
	}
	clash := false
	r.Attrs(func(a slog.Attr) bool {
		_, clash = d.attrs[a.Key]
		return !clash
	})
	if !clash {
		return d.h.Handle(ctx, r)
	}
	prefix := "arg."
	if c, ok := d.attrs["component"]; ok {
		prefix = c.String() + "."
	}
	out := slog.NewRecord(r.Time, r.Level, r.Message, r.PC)
	seen := map[string]bool{}
	r.Attrs(func(a slog.Attr) bool {
		if v, ok := d.attrs[a.Key]; ok {
			if v.Equal(a.Value.Resolve()) {
				return true // says again what the line already says
			}
			a.Key = prefix + a.Key
		}
		if !seen[a.Key] {
			seen[a.Key] = true
			out.AddAttrs(a)
		}
		return true
	})
	return d.h.Handle(ctx, out)
}

// WithAttrs adds the attributes the logger does not carry yet.
func (d *dedupHandler) WithAttrs(as []slog.Attr) slog.Handler {
	if d.group {
		return &dedupHandler{h: d.h.WithAttrs(as), group: true}
	}
	attrs := maps.Clone(d.attrs)
	if attrs == nil {
		attrs = map[string]slog.Value{}
	}
	keep := make([]slog.Attr, 0, len(as))
	for _, a := range as {
		v := a.Value.Resolve()
		if old, ok := attrs[a.Key]; ok && old.Equal(v) {
			continue
		}
		attrs[a.Key] = v
		keep = append(keep, a)
	}
	return &dedupHandler{h: d.h.WithAttrs(keep), attrs: attrs}
}

// WithGroup opens a group; keys inside it are not compared.
func (d *dedupHandler) WithGroup(name string) slog.Handler {
	if name == "" {
		return d
	}
	return &dedupHandler{h: d.h.WithGroup(name), group: true}
}
