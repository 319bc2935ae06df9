package chat

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// scope is one frame of variables; lookups fall back to the parent.
type scope struct {
	vars   map[string]any
	parent *scope
}

func (s *scope) lookup(name string) (any, bool) {
	for f := s; f != nil; f = f.parent {
		if v, ok := f.vars[name]; ok {
			return v, true
		}
	}
	return nil, false
}

// raisedError is a template's raise_exception(msg).
type raisedError struct{ msg string }

func (e *raisedError) Error() string { return e.msg }

// evaluator renders one template call; it is not shared between renders.
type evaluator struct {
	out   *strings.Builder
	sc    *scope
	now   func() time.Time
	depth int
}

// ctrl is how a statement list ended.
type ctrl int

const (
	ctrlNone ctrl = iota
	ctrlBreak
	ctrlContinue
)

const maxMacroDepth = 200

// capture renders body in a child scope of parent into a string.
func (ev *evaluator) capture(body []stmt, sc *scope) (string, ctrl, error) {
	saved, savedSc := ev.out, ev.sc
	var b strings.Builder
	ev.out, ev.sc = &b, sc
	c, err := ev.execAll(body)
	ev.out, ev.sc = saved, savedSc
	return b.String(), c, err
}

func (ev *evaluator) execAll(body []stmt) (ctrl, error) {
	for _, s := range body {
		c, err := ev.exec(s)
		if err != nil || c != ctrlNone {
			return c, err
		}
	}
	return ctrlNone, nil
}

func (ev *evaluator) exec(s stmt) (ctrl, error) {
	switch t := s.(type) {
	case *textStmt:
		ev.out.WriteString(t.s)
	case *printStmt:
		v, err := ev.eval(t.e)
		if err != nil {
			return 0, err
		}
		ev.out.WriteString(pyStr(v))
	case *ifStmt:
		for i, c := range t.conds {
			v, err := ev.eval(c)
			if err != nil {
				return 0, err
			}
			if truthy(v) {
				return ev.execAll(t.bodies[i])
			}
		}
		return ev.execAll(t.els)
	case *forStmt:
		return ctrlNone, ev.execFor(t)
	case *setStmt:
		return ctrlNone, ev.execSet(t)
	case *macroStmt:
		ev.sc.vars[t.name] = &macroValue{def: t, sc: ev.sc}
	case *callBlockStmt:
		caller := &macroValue{def: &macroStmt{name: "caller", params: t.params, defaults: t.defaults, body: t.body}, sc: ev.sc}
		c := *t.call
		c.kwNames = append(append([]string(nil), c.kwNames...), "caller")
		c.kwVals = append(append([]expr(nil), c.kwVals...), &constExpr{caller})
		v, err := ev.eval(&c)
		if err != nil {
			return 0, err
		}
		ev.out.WriteString(pyStr(v))
	case *filterBlockStmt:
		text, _, err := ev.capture(t.body, ev.sc)
		if err != nil {
			return 0, err
		}
		v, err := ev.applyFilters(text, t.filters)
		if err != nil {
			return 0, err
		}
		ev.out.WriteString(pyStr(v))
	case *scopeStmt:
		text, _, err := ev.capture(t.body, &scope{vars: map[string]any{}, parent: ev.sc})
		if err != nil {
			return 0, err
		}
		ev.out.WriteString(text)
	case *breakStmt:
		return ctrlBreak, nil
	case *continueStmt:
		return ctrlContinue, nil
	default:
		return 0, fmt.Errorf("unknown statement %T", s)
	}
	return ctrlNone, nil
}

func (ev *evaluator) applyFilters(v any, filters []*filterExpr) (any, error) {
	for _, f := range filters {
		var err error
		if v, err = ev.filter(f, v); err != nil {
			return nil, err
		}
	}
	return v, nil
}

// bindTargets assigns a loop or set target list in vars.
func bindTargets(vars map[string]any, names []string, v any) error {
	if len(names) == 1 {
		vars[names[0]] = v
		return nil
	}
	items, err := iterate(v)
	if err != nil {
		return fmt.Errorf("cannot unpack non-iterable %s object", typeName(v))
	}
	if len(items) != len(names) {
		if len(items) > len(names) {
			return fmt.Errorf("too many values to unpack (expected %d)", len(names))
		}
		return fmt.Errorf("not enough values to unpack (expected %d, got %d)", len(names), len(items))
	}
	for i, n := range names {
		vars[n] = items[i]
	}
	return nil
}

func (ev *evaluator) execFor(t *forStmt) error {
	iv, err := ev.eval(t.iter)
	if err != nil {
		return err
	}
	items, err := iterate(iv)
	if err != nil {
		return err
	}
	sc := &scope{vars: map[string]any{}, parent: ev.sc}
	saved := ev.sc
	ev.sc = sc
	defer func() { ev.sc = saved }()
	if t.cond != nil {
		kept := items[:0:0]
		for _, it := range items {
			if err := bindTargets(sc.vars, t.targets, it); err != nil {
				return err
			}
			ok, err := ev.eval(t.cond)
			if err != nil {
				return err
			}
			if truthy(ok) {
				kept = append(kept, it)
			}
		}
		items = kept
	}
	if len(items) == 0 {
		_, err := ev.execAll(t.els)
		return err
	}
	loop := &loopState{items: items}
	for i, it := range items {
		loop.index0 = i
		if err := bindTargets(sc.vars, t.targets, it); err != nil {
			return err
		}
		sc.vars["loop"] = loop
		c, err := ev.execAll(t.body)
		if err != nil {
			return err
		}
		if c == ctrlBreak {
			break
		}
	}
	return nil
}

func (ev *evaluator) execSet(t *setStmt) error {
	var v any
	var err error
	if t.value != nil {
		v, err = ev.eval(t.value)
	} else {
		var text string
		text, _, err = ev.capture(t.body, ev.sc)
		if err == nil {
			v, err = ev.applyFilters(text, t.filters)
		}
	}
	if err != nil {
		return err
	}
	if t.attr != "" {
		obj, _ := ev.sc.lookup(t.names[0])
		ns, ok := obj.(*namespace)
		if !ok {
			return errors.New("cannot assign attribute on non-namespace object")
		}
		return ns.attrs.set(t.attr, v)
	}
	return bindTargets(ev.sc.vars, t.names, v)
}

// loopState is the loop variable of a for loop.
type loopState struct {
	items  []any
	index0 int
	last   any // for changed()
	seen   bool
}

func (l *loopState) attr(name string) any {
	n := len(l.items)
	switch name {
	case "index0":
		return int64(l.index0)
	case "index":
		return int64(l.index0 + 1)
	case "revindex":
		return int64(n - l.index0)
	case "revindex0":
		return int64(n - l.index0 - 1)
	case "first":
		return l.index0 == 0
	case "last":
		return l.index0 == n-1
	case "length":
		return int64(n)
	case "depth":
		return int64(1)
	case "depth0":
		return int64(0)
	case "previtem":
		if l.index0 > 0 {
			return l.items[l.index0-1]
		}
		return undefined{"'previtem'"}
	case "nextitem":
		if l.index0+1 < n {
			return l.items[l.index0+1]
		}
		return undefined{"'nextitem'"}
	case "cycle":
		return builtinFunc(func(_ *evaluator, args []any, _ *pyDict) (any, error) {
			if len(args) == 0 {
				return nil, errors.New("no items for cycling given")
			}
			return args[l.index0%len(args)], nil
		})
	case "changed":
		return builtinFunc(func(_ *evaluator, args []any, _ *pyDict) (any, error) {
			v := pyTuple(args)
			if l.seen && pyEqual(l.last, v) {
				return false, nil
			}
			l.last, l.seen = v, true
			return true, nil
		})
	}
	return undefined{"'loop' has no attribute '" + name + "'"}
}

// macroValue is a macro bound to the scope it was defined in.
type macroValue struct {
	def *macroStmt
	sc  *scope
}

func (m *macroValue) call(ev *evaluator, args []any, kw *pyDict) (any, error) {
	if ev.depth >= maxMacroDepth {
		return nil, errors.New("maximum macro recursion depth exceeded")
	}
	sc := &scope{vars: map[string]any{}, parent: m.sc}
	d := m.def
	if len(args) > len(d.params) {
		sc.vars["varargs"] = pyTuple(args[len(d.params):])
	} else {
		sc.vars["varargs"] = pyTuple{}
	}
	extra := newPyDict()
	if kw != nil {
		for _, k := range kw.keys {
			v, _ := kw.get(k)
			name, _ := k.(string)
			if name == "caller" {
				sc.vars["caller"] = v
				continue
			}
			known := false
			for _, p := range d.params {
				known = known || p == name
			}
			if !known {
				_ = extra.set(k, v)
				continue
			}
			sc.vars[name] = v
		}
	}
	sc.vars["kwargs"] = extra
	firstDefault := len(d.params) - len(d.defaults)
	for i, p := range d.params {
		if i < len(args) {
			if _, dup := sc.vars[p]; dup && kw != nil {
				if _, inKw := kw.get(p); inKw {
					return nil, fmt.Errorf("macro '%s' got multiple values for argument '%s'", d.name, p)
				}
			}
			sc.vars[p] = args[i]
			continue
		}
		if _, ok := sc.vars[p]; ok {
			continue
		}
		if i >= firstDefault {
			saved := ev.sc
			ev.sc = sc
			v, err := ev.eval(d.defaults[i-firstDefault])
			ev.sc = saved
			if err != nil {
				return nil, err
			}
			sc.vars[p] = v
		} else {
			sc.vars[p] = undefined{"'" + p + "'"}
		}
	}
	ev.depth++
	out, _, err := ev.capture(d.body, sc)
	ev.depth--
	return out, err
}
