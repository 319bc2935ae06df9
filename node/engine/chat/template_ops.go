package chat

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"unicode/utf8"
)

func (ev *evaluator) eval(e expr) (any, error) {
	switch t := e.(type) {
	case *constExpr:
		return t.v, nil
	case *nameExpr:
		if v, ok := ev.sc.lookup(t.name); ok {
			return v, nil
		}
		if f := globalFunc(t.name); f != nil {
			return f, nil
		}
		return undefined{"'" + t.name + "'"}, nil
	case *listExpr:
		out := make([]any, len(t.items))
		for i, x := range t.items {
			v, err := ev.eval(x)
			if err != nil {
				return nil, err
			}
			out[i] = v
		}
		return out, nil
	case *tupleExpr:
		out := make(pyTuple, len(t.items))
		for i, x := range t.items {
			v, err := ev.eval(x)
			if err != nil {
				return nil, err
			}
			out[i] = v
		}
		return out, nil
	case *dictExpr:
		d := newPyDict()
		for i := range t.keys {
			k, err := ev.eval(t.keys[i])
			if err != nil {
				return nil, err
			}
			v, err := ev.eval(t.vals[i])
			if err != nil {
				return nil, err
			}
			if err := d.set(k, v); err != nil {
				return nil, err
			}
		}
		return d, nil
	case *attrExpr:
		obj, err := ev.eval(t.obj)
		if err != nil {
			return nil, err
		}
		return getAttr(obj, t.name)
	case *itemExpr:
		obj, err := ev.eval(t.obj)
		if err != nil {
			return nil, err
		}
		key, err := ev.eval(t.key)
		if err != nil {
			return nil, err
		}
		return getItem(obj, key)
	case *sliceExpr:
		return ev.evalSlice(t)
	case *callExpr:
		fn, err := ev.eval(t.fn)
		if err != nil {
			return nil, err
		}
		args, kw, err := ev.evalArgs(t)
		if err != nil {
			return nil, err
		}
		return callValue(ev, fn, args, kw)
	case *filterExpr:
		v, err := ev.eval(t.obj)
		if err != nil {
			return nil, err
		}
		return ev.filter(t, v)
	case *testExpr:
		v, err := ev.eval(t.obj)
		if err != nil {
			return nil, err
		}
		args, kw, err := ev.evalArgs(&t.call)
		if err != nil {
			return nil, err
		}
		ok, err := ev.test(t.name, v, args, kw)
		if err != nil {
			return nil, err
		}
		return ok != t.negate, nil
	case *unaryExpr:
		x, err := ev.eval(t.x)
		if err != nil {
			return nil, err
		}
		return unaryOp(t.op, x)
	case *binExpr:
		return ev.evalBinary(t)
	case *compareExpr:
		return ev.evalCompare(t)
	case *condExpr:
		c, err := ev.eval(t.cond)
		if err != nil {
			return nil, err
		}
		if truthy(c) {
			return ev.eval(t.yes)
		}
		if t.no == nil {
			return undefined{"conditional expression"}, nil
		}
		return ev.eval(t.no)
	}
	return nil, fmt.Errorf("unknown expression %T", e)
}

func (ev *evaluator) evalArgs(c *callExpr) ([]any, *pyDict, error) {
	args := make([]any, len(c.args))
	for i, a := range c.args {
		v, err := ev.eval(a)
		if err != nil {
			return nil, nil, err
		}
		args[i] = v
	}
	if c.starArgs != nil {
		v, err := ev.eval(c.starArgs)
		if err != nil {
			return nil, nil, err
		}
		more, err := iterate(v)
		if err != nil {
			return nil, nil, err
		}
		args = append(args, more...)
	}
	var kw *pyDict
	if len(c.kwNames) > 0 || c.starKw != nil {
		kw = newPyDict()
		for i, n := range c.kwNames {
			v, err := ev.eval(c.kwVals[i])
			if err != nil {
				return nil, nil, err
			}
			_ = kw.set(n, v)
		}
		if c.starKw != nil {
			v, err := ev.eval(c.starKw)
			if err != nil {
				return nil, nil, err
			}
			d, ok := v.(*pyDict)
			if !ok {
				return nil, nil, fmt.Errorf("argument after ** must be a mapping, not %s", typeName(v))
			}
			for _, k := range d.keys {
				x, _ := d.get(k)
				_ = kw.set(k, x)
			}
		}
	}
	return args, kw, nil
}

func callValue(ev *evaluator, fn any, args []any, kw *pyDict) (any, error) {
	switch f := fn.(type) {
	case callable:
		return f.call(ev, args, kw)
	case undefined:
		return nil, undefinedErr(f)
	}
	return nil, fmt.Errorf("'%s' object is not callable", typeName(fn))
}

func (ev *evaluator) evalSlice(t *sliceExpr) (any, error) {
	obj, err := ev.eval(t.obj)
	if err != nil {
		return nil, err
	}
	var bounds [3]*int64
	for i, e := range []expr{t.start, t.stop, t.step} {
		if e == nil {
			continue
		}
		v, err := ev.eval(e)
		if err != nil {
			return nil, err
		}
		if v == nil {
			continue
		}
		n, ok := asInt(v)
		if !ok {
			return nil, errors.New("slice indices must be integers or None")
		}
		bounds[i] = &n
	}
	return sliceValue(obj, bounds[0], bounds[1], bounds[2])
}

// sliceValue is Python's obj[start:stop:step].
func sliceValue(obj any, start, stop, step *int64) (any, error) {
	var items []any
	switch t := obj.(type) {
	case string:
		items, _ = iterate(t)
	case []any:
		items = t
	case pyTuple:
		items = t
	case undefined:
		return nil, undefinedErr(t)
	default:
		return nil, fmt.Errorf("'%s' object is not subscriptable", typeName(obj))
	}
	n := int64(len(items))
	st := int64(1)
	if step != nil {
		st = *step
	}
	if st == 0 {
		return nil, errors.New("slice step cannot be zero")
	}
	clamp := func(p *int64, def, lo, hi int64) int64 {
		if p == nil {
			return def
		}
		v := *p
		if v < 0 {
			v += n
			if v < lo {
				v = lo
			}
		} else if v > hi {
			v = hi
		}
		return v
	}
	var out []any
	if st > 0 {
		a, b := clamp(start, 0, 0, n), clamp(stop, n, 0, n)
		for i := a; i < b; i += st {
			out = append(out, items[i])
		}
	} else {
		a, b := clamp(start, n-1, -1, n-1), clamp(stop, -1, -1, n-1)
		for i := a; i > b; i += st {
			out = append(out, items[i])
		}
	}
	switch obj.(type) {
	case string:
		var b strings.Builder
		for _, x := range out {
			b.WriteString(x.(string))
		}
		return b.String(), nil
	case pyTuple:
		return pyTuple(out), nil
	}
	if out == nil {
		out = []any{}
	}
	return out, nil
}

func asInt(v any) (int64, bool) {
	switch t := v.(type) {
	case int64:
		return t, true
	case bool:
		if t {
			return 1, true
		}
		return 0, true
	}
	return 0, false
}

// getAttr is jinja2's sandboxed obj.name: a method or attribute first,
// then an item.
func getAttr(obj any, name string) (any, error) {
	switch t := obj.(type) {
	case undefined:
		return nil, undefinedErr(t)
	case *pyDict:
		if m := method(t, name); m != nil {
			return m, nil
		}
		if v, ok := t.get(name); ok {
			return v, nil
		}
	case *namespace:
		if v, ok := t.attrs.get(name); ok {
			return v, nil
		}
	case *loopState:
		return t.attr(name), nil
	default:
		if m := method(obj, name); m != nil {
			return m, nil
		}
	}
	return undefined{fmt.Sprintf("'%s object' has no attribute '%s'", typeName(obj), name)}, nil
}

// getItem is jinja2's sandboxed obj[key]: an item first, then an attribute.
func getItem(obj, key any) (any, error) {
	switch t := obj.(type) {
	case undefined:
		return nil, undefinedErr(t)
	case *pyDict:
		if v, ok := t.get(key); ok {
			return v, nil
		}
	case []any, pyTuple, string:
		if i, ok := asInt(key); ok {
			var items []any
			if s, isStr := t.(string); isStr {
				items, _ = iterate(s)
			} else {
				items, _ = iterate(t)
			}
			if i < 0 {
				i += int64(len(items))
			}
			if i >= 0 && i < int64(len(items)) {
				return items[i], nil
			}
			return undefined{fmt.Sprintf("'%s object' has no element %v", typeName(obj), key)}, nil
		}
	}
	if s, ok := key.(string); ok {
		return getAttr(obj, s)
	}
	return undefined{fmt.Sprintf("'%s object' has no element %s", typeName(obj), repr(key))}, nil
}

func unaryOp(op string, x any) (any, error) {
	if op == "not" {
		return !truthy(x), nil
	}
	if u, ok := x.(undefined); ok {
		return nil, undefinedErr(u)
	}
	switch t := x.(type) {
	case bool:
		n, _ := asInt(t)
		if op == "-" {
			return -n, nil
		}
		return n, nil
	case int64:
		if op == "-" {
			return -t, nil
		}
		return t, nil
	case float64:
		if op == "-" {
			return -t, nil
		}
		return t, nil
	}
	return nil, fmt.Errorf("bad operand type for unary %s: '%s'", op, typeName(x))
}

func (ev *evaluator) evalBinary(t *binExpr) (any, error) {
	l, err := ev.eval(t.l)
	if err != nil {
		return nil, err
	}
	switch t.op {
	case "and":
		if !truthy(l) {
			return l, nil
		}
		return ev.eval(t.r)
	case "or":
		if truthy(l) {
			return l, nil
		}
		return ev.eval(t.r)
	}
	r, err := ev.eval(t.r)
	if err != nil {
		return nil, err
	}
	if t.op == "~" {
		return pyStr(l) + pyStr(r), nil
	}
	return arith(t.op, l, r)
}

// arith is Python's binary arithmetic.
func arith(op string, l, r any) (any, error) {
	if u, ok := l.(undefined); ok {
		return nil, undefinedErr(u)
	}
	if u, ok := r.(undefined); ok {
		return nil, undefinedErr(u)
	}
	li, lInt := asInt(l)
	ri, rInt := asInt(r)
	lf, lNum := number(l)
	rf, rNum := number(r)
	if lNum && rNum {
		bothInt := lInt && rInt
		switch op {
		case "+":
			if bothInt {
				return li + ri, nil
			}
			return lf + rf, nil
		case "-":
			if bothInt {
				return li - ri, nil
			}
			return lf - rf, nil
		case "*":
			if bothInt {
				return li * ri, nil
			}
			return lf * rf, nil
		case "/":
			if rf == 0 {
				return nil, errors.New("division by zero")
			}
			return lf / rf, nil
		case "//":
			if rf == 0 {
				return nil, errors.New("integer division or modulo by zero")
			}
			if bothInt {
				q := li / ri
				if (li%ri != 0) && ((li < 0) != (ri < 0)) {
					q--
				}
				return q, nil
			}
			return math.Floor(lf / rf), nil
		case "%":
			if rf == 0 {
				return nil, errors.New("integer division or modulo by zero")
			}
			if bothInt {
				m := li % ri
				if m != 0 && (m < 0) != (ri < 0) {
					m += ri
				}
				return m, nil
			}
			m := math.Mod(lf, rf)
			if m != 0 && (m < 0) != (rf < 0) {
				m += rf
			}
			return m, nil
		case "**":
			if bothInt && ri >= 0 {
				p := int64(1)
				for range ri {
					p *= li
				}
				return p, nil
			}
			return math.Pow(lf, rf), nil
		}
	}
	switch op {
	case "+":
		switch a := l.(type) {
		case string:
			if b, ok := r.(string); ok {
				return a + b, nil
			}
			return nil, fmt.Errorf("can only concatenate str (not \"%s\") to str", typeName(r))
		case []any:
			if b, ok := r.([]any); ok {
				return append(append([]any{}, a...), b...), nil
			}
			return nil, fmt.Errorf("can only concatenate list (not \"%s\") to list", typeName(r))
		case pyTuple:
			if b, ok := r.(pyTuple); ok {
				return append(append(pyTuple{}, a...), b...), nil
			}
		}
	case "*":
		if s, ok := l.(string); ok && rInt {
			return strings.Repeat(s, int(max(ri, 0))), nil
		}
		if s, ok := r.(string); ok && lInt {
			return strings.Repeat(s, int(max(li, 0))), nil
		}
		if a, ok := l.([]any); ok && rInt {
			var out []any
			for range max(ri, 0) {
				out = append(out, a...)
			}
			if out == nil {
				out = []any{}
			}
			return out, nil
		}
	case "%":
		if s, ok := l.(string); ok {
			return percentFormat(s, r)
		}
	}
	return nil, fmt.Errorf("unsupported operand type(s) for %s: '%s' and '%s'", op, typeName(l), typeName(r))
}

func (ev *evaluator) evalCompare(t *compareExpr) (any, error) {
	l, err := ev.eval(t.first)
	if err != nil {
		return nil, err
	}
	for i, op := range t.ops {
		r, err := ev.eval(t.rest[i])
		if err != nil {
			return nil, err
		}
		ok, err := compare(op, l, r)
		if err != nil || !ok {
			return false, err
		}
		l = r
	}
	return true, nil
}

func compare(op string, l, r any) (bool, error) {
	switch op {
	case "==":
		return pyEqual(l, r), nil
	case "!=":
		return !pyEqual(l, r), nil
	case "in":
		return contains(r, l)
	case "notin":
		ok, err := contains(r, l)
		return !ok, err
	}
	c, err := pyCompare(l, r)
	if err != nil {
		return false, err
	}
	switch op {
	case "<":
		return c < 0, nil
	case "<=":
		return c <= 0, nil
	case ">":
		return c > 0, nil
	}
	return c >= 0, nil
}

// runeLen is the number of code points in s.
func runeLen(s string) int { return utf8.RuneCountInString(s) }
