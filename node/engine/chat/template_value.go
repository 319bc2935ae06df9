package chat

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Values in the Jinja engine follow Python's data model as jinja2 sees it:
//
//	nil           None
//	undefined     jinja2.Undefined (prints "", falsy, fails on use)
//	bool          bool
//	int64         int
//	float64       float
//	string        str
//	[]any         list (the sandbox forbids mutating lists)
//	pyTuple       tuple
//	*pyDict       dict, insertion-ordered
//	*namespace    jinja2's namespace()
//	callable      functions, macros and bound methods
type (
	// undefined is a missing variable, key or attribute; name says which.
	undefined struct{ name string }
	// pyTuple is a Python tuple (printed with parentheses).
	pyTuple []any
	// namespace is the mutable object templates create with namespace().
	namespace struct{ attrs *pyDict }
	// callable is anything a template can call.
	callable interface {
		call(ev *evaluator, args []any, kw *pyDict) (any, error)
	}
	// builtinFunc adapts a Go function to callable.
	builtinFunc func(ev *evaluator, args []any, kw *pyDict) (any, error)
)

func (f builtinFunc) call(ev *evaluator, args []any, kw *pyDict) (any, error) { return f(ev, args, kw) }

// pyDict is an insertion-ordered Python dict.
type pyDict struct {
	keys []any
	vals map[any]any
}

func newPyDict() *pyDict { return &pyDict{vals: map[any]any{}} }

// dictKey normalises a key the way Python hashes it (1.0 and 1 are one key).
func dictKey(k any) (any, error) {
	switch t := k.(type) {
	case nil, string, int64, bool:
		return k, nil
	case float64:
		if t == math.Trunc(t) && math.Abs(t) < 1<<53 {
			return int64(t), nil
		}
		return k, nil
	case pyTuple:
		return repr(t), nil
	}
	return nil, fmt.Errorf("unhashable type: '%s'", typeName(k))
}

func (d *pyDict) set(k, v any) error {
	key, err := dictKey(k)
	if err != nil {
		return err
	}
	if _, ok := d.vals[key]; !ok {
		d.keys = append(d.keys, k)
	}
	d.vals[key] = v
	return nil
}

func (d *pyDict) get(k any) (any, bool) {
	key, err := dictKey(k)
	if err != nil {
		return nil, false
	}
	v, ok := d.vals[key]
	return v, ok
}

func (d *pyDict) len() int { return len(d.keys) }

// items returns the (key, value) pairs in order.
func (d *pyDict) items() []any {
	out := make([]any, len(d.keys))
	for i, k := range d.keys {
		v, _ := d.get(k)
		out[i] = pyTuple{k, v}
	}
	return out
}

func (d *pyDict) copy() *pyDict {
	c := newPyDict()
	for _, k := range d.keys {
		v, _ := d.get(k)
		_ = c.set(k, v)
	}
	return c
}

// typeName is Python's type(v).__name__.
func typeName(v any) string {
	switch v.(type) {
	case nil:
		return "NoneType"
	case undefined:
		return "Undefined"
	case bool:
		return "bool"
	case int64:
		return "int"
	case float64:
		return "float"
	case string:
		return "str"
	case []any:
		return "list"
	case pyTuple:
		return "tuple"
	case *pyDict:
		return "dict"
	case *namespace:
		return "Namespace"
	case *loopState:
		return "LoopContext"
	case callable:
		return "function"
	}
	return fmt.Sprintf("%T", v)
}

// truthy is Python's bool(v).
func truthy(v any) bool {
	switch t := v.(type) {
	case nil, undefined:
		return false
	case bool:
		return t
	case int64:
		return t != 0
	case float64:
		return t != 0
	case string:
		return t != ""
	case []any:
		return len(t) > 0
	case pyTuple:
		return len(t) > 0
	case *pyDict:
		return t.len() > 0
	}
	return true
}

// pyStr is Python's str(v), with undefined printing as "".
func pyStr(v any) string {
	switch t := v.(type) {
	case string:
		return t
	case undefined:
		return ""
	}
	return repr(v)
}

// repr is Python's repr(v).
func repr(v any) string {
	var b strings.Builder
	writeRepr(&b, v)
	return b.String()
}

func writeRepr(b *strings.Builder, v any) {
	switch t := v.(type) {
	case nil:
		b.WriteString("None")
	case undefined:
		// str(Undefined) is "", and so is its appearance inside a container's repr.
	case bool:
		if t {
			b.WriteString("True")
		} else {
			b.WriteString("False")
		}
	case int64:
		b.WriteString(strconv.FormatInt(t, 10))
	case float64:
		b.WriteString(pyFloat(t))
	case string:
		writeStrRepr(b, t)
	case []any:
		b.WriteByte('[')
		for i, x := range t {
			if i > 0 {
				b.WriteString(", ")
			}
			writeRepr(b, x)
		}
		b.WriteByte(']')
	case pyTuple:
		b.WriteByte('(')
		for i, x := range t {
			if i > 0 {
				b.WriteString(", ")
			}
			writeRepr(b, x)
		}
		if len(t) == 1 {
			b.WriteByte(',')
		}
		b.WriteByte(')')
	case *pyDict:
		b.WriteByte('{')
		for i, k := range t.keys {
			if i > 0 {
				b.WriteString(", ")
			}
			writeRepr(b, k)
			b.WriteString(": ")
			x, _ := t.get(k)
			writeRepr(b, x)
		}
		b.WriteByte('}')
	case *namespace:
		b.WriteString("<Namespace ")
		writeRepr(b, t.attrs)
		b.WriteByte('>')
	default:
		fmt.Fprintf(b, "<%s>", typeName(v))
	}
}

// writeStrRepr quotes s as Python's repr does.
func writeStrRepr(b *strings.Builder, s string) {
	q := byte('\'')
	if strings.ContainsRune(s, '\'') && !strings.ContainsRune(s, '"') {
		q = '"'
	}
	b.WriteByte(q)
	for _, r := range s {
		switch {
		case r == rune(q) || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(b, `\x%02x`, r)
		case r < 0x7f || unicode.IsPrint(r):
			b.WriteRune(r)
		case r <= 0xff:
			fmt.Fprintf(b, `\x%02x`, r)
		case r <= 0xffff:
			fmt.Fprintf(b, `\u%04x`, r)
		default:
			fmt.Fprintf(b, `\U%08x`, r)
		}
	}
	b.WriteByte(q)
}

// pyFloat formats f as Python's float repr: the shortest round-trip
// digits, positional from 1e-4 to 1e16, scientific outside.
func pyFloat(f float64) string {
	switch {
	case math.IsNaN(f):
		return "nan"
	case math.IsInf(f, 1):
		return "inf"
	case math.IsInf(f, -1):
		return "-inf"
	}
	s := strconv.FormatFloat(f, 'e', -1, 64) // d.ddde±xx
	mant, expStr, _ := strings.Cut(s, "e")
	exp, _ := strconv.Atoi(expStr)
	neg := strings.HasPrefix(mant, "-")
	mant = strings.TrimPrefix(mant, "-")
	digits := strings.Replace(mant, ".", "", 1)
	sign := ""
	if neg {
		sign = "-"
	}
	if exp < -4 || exp >= 16 {
		m := digits[:1]
		if len(digits) > 1 {
			m += "." + digits[1:]
		}
		es := "+"
		if exp < 0 {
			es, exp = "-", -exp
		}
		return fmt.Sprintf("%s%se%s%02d", sign, m, es, exp)
	}
	if exp < 0 {
		return sign + "0." + strings.Repeat("0", -exp-1) + digits
	}
	if len(digits) <= exp+1 {
		return sign + digits + strings.Repeat("0", exp+1-len(digits)) + ".0"
	}
	return sign + digits[:exp+1] + "." + digits[exp+1:]
}

// pyEqual is Python's ==.
func pyEqual(a, b any) bool {
	if na, ok := number(a); ok {
		if nb, ok := number(b); ok {
			return na == nb
		}
		return false
	}
	switch x := a.(type) {
	case nil:
		return b == nil
	case undefined:
		_, ok := b.(undefined)
		return ok
	case string:
		y, ok := b.(string)
		return ok && x == y
	case []any:
		y, ok := b.([]any)
		return ok && seqEqual(x, y)
	case pyTuple:
		y, ok := b.(pyTuple)
		return ok && seqEqual(x, y)
	case *pyDict:
		y, ok := b.(*pyDict)
		if !ok || x.len() != y.len() {
			return false
		}
		for _, k := range x.keys {
			xv, _ := x.get(k)
			yv, ok := y.get(k)
			if !ok || !pyEqual(xv, yv) {
				return false
			}
		}
		return true
	}
	return a == b
}

func seqEqual(x, y []any) bool {
	if len(x) != len(y) {
		return false
	}
	for i := range x {
		if !pyEqual(x[i], y[i]) {
			return false
		}
	}
	return true
}

// number reports v as a float64 when it is a Python number (bools count).
func number(v any) (float64, bool) {
	switch t := v.(type) {
	case bool:
		if t {
			return 1, true
		}
		return 0, true
	case int64:
		return float64(t), true
	case float64:
		return t, true
	}
	return 0, false
}

// pyCompare is Python's ordering: -1, 0 or 1, or a TypeError.
func pyCompare(a, b any) (int, error) {
	if ia, ok := a.(int64); ok {
		if ib, ok := b.(int64); ok {
			return cmpOrdered(ia, ib), nil
		}
	}
	if na, ok := number(a); ok {
		if nb, ok := number(b); ok {
			return cmpOrdered(na, nb), nil
		}
	}
	switch x := a.(type) {
	case string:
		if y, ok := b.(string); ok {
			return strings.Compare(x, y), nil
		}
	case []any:
		if y, ok := b.([]any); ok {
			return seqCompare(x, y)
		}
	case pyTuple:
		if y, ok := b.(pyTuple); ok {
			return seqCompare(x, y)
		}
	}
	if u, ok := a.(undefined); ok {
		return 0, undefinedErr(u)
	}
	if u, ok := b.(undefined); ok {
		return 0, undefinedErr(u)
	}
	return 0, fmt.Errorf("'<' not supported between instances of '%s' and '%s'", typeName(a), typeName(b))
}

func cmpOrdered[T int64 | float64](a, b T) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func seqCompare(x, y []any) (int, error) {
	for i := 0; i < len(x) && i < len(y); i++ {
		if pyEqual(x[i], y[i]) {
			continue
		}
		return pyCompare(x[i], y[i])
	}
	return cmpOrdered(int64(len(x)), int64(len(y))), nil
}

// sortValues sorts vals stably with Python's ordering, keyed by key.
func sortValues(vals []any, key func(any) any, reverse bool) error {
	var err error
	sort.SliceStable(vals, func(i, j int) bool {
		a, b := key(vals[i]), key(vals[j])
		if reverse {
			a, b = b, a
		}
		c, e := pyCompare(a, b)
		if e != nil && err == nil {
			err = e
		}
		return c < 0
	})
	return err
}

// iterate lists the items Python's iter(v) yields. For lists and tuples
// it returns the value's own backing slice: callers must not modify it.
func iterate(v any) ([]any, error) {
	switch t := v.(type) {
	case undefined:
		return nil, nil
	case []any:
		return t, nil
	case pyTuple:
		return t, nil
	case *pyDict:
		return append([]any(nil), t.keys...), nil
	case string:
		out := make([]any, 0, utf8.RuneCountInString(t))
		for _, r := range t {
			out = append(out, string(r))
		}
		return out, nil
	case *namespace:
		return nil, fmt.Errorf("'Namespace' object is not iterable")
	}
	return nil, fmt.Errorf("'%s' object is not iterable", typeName(v))
}

// pyLen is Python's len(v); undefined has length 0.
func pyLen(v any) (int64, error) {
	switch t := v.(type) {
	case undefined:
		return 0, nil
	case string:
		return int64(utf8.RuneCountInString(t)), nil
	case []any:
		return int64(len(t)), nil
	case pyTuple:
		return int64(len(t)), nil
	case *pyDict:
		return int64(t.len()), nil
	}
	return 0, fmt.Errorf("object of type '%s' has no len()", typeName(v))
}

// contains is Python's `item in container`.
func contains(container, item any) (bool, error) {
	switch t := container.(type) {
	case string:
		s, ok := item.(string)
		if !ok {
			return false, fmt.Errorf("'in <string>' requires string as left operand, not %s", typeName(item))
		}
		return strings.Contains(t, s), nil
	case *pyDict:
		_, ok := t.get(item)
		return ok, nil
	case undefined:
		return false, nil
	}
	items, err := iterate(container)
	if err != nil {
		return false, fmt.Errorf("argument of type '%s' is not iterable", typeName(container))
	}
	for _, x := range items {
		if pyEqual(x, item) {
			return true, nil
		}
	}
	return false, nil
}

// undefinedErr is jinja2's UndefinedError for using u.
func undefinedErr(u undefined) error {
	if u.name == "" {
		return fmt.Errorf("undefined value")
	}
	return fmt.Errorf("%s is undefined", u.name)
}

// pyIsSpace is Python's str.isspace for one rune.
func pyIsSpace(r rune) bool {
	return unicode.IsSpace(r) || (r >= 0x1c && r <= 0x1f)
}
