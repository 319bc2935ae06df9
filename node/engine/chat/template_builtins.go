package chat

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// test evaluates `v is name(args)`.
func (ev *evaluator) test(name string, v any, args []any, kw *pyDict) (bool, error) {
	p := params{args, kw}
	arg := func() any { return p.get(0, "other", nil) }
	_, isUndef := v.(undefined)
	switch name {
	case "defined":
		return !isUndef, nil
	case "undefined":
		return isUndef, nil
	case "none":
		return v == nil, nil
	case "boolean":
		_, ok := v.(bool)
		return ok, nil
	case "true", "false":
		b, ok := v.(bool)
		return ok && b == (name == "true"), nil
	case "integer":
		_, ok := v.(int64)
		return ok, nil
	case "float":
		_, ok := v.(float64)
		return ok, nil
	case "number":
		_, ok := number(v)
		return ok, nil
	case "string":
		_, ok := v.(string)
		return ok, nil
	case "mapping":
		_, ok := v.(*pyDict)
		return ok, nil
	case "iterable":
		switch v.(type) {
		case string, []any, pyTuple, *pyDict, undefined:
			return true, nil
		}
		return false, nil
	case "sequence":
		switch v.(type) {
		case string, []any, pyTuple, *pyDict:
			return true, nil
		}
		return false, nil
	case "callable":
		_, ok := v.(callable)
		return ok, nil
	case "sameas":
		o := arg()
		switch v.(type) {
		case nil, bool:
			return v == o, nil
		}
		return pyEqual(v, o) && typeName(v) == typeName(o), nil
	case "escaped":
		return false, nil
	case "lower", "upper":
		s, ok := v.(string)
		if !ok {
			return false, nil
		}
		if name == "lower" {
			return s == strings.ToLower(s), nil
		}
		return s == strings.ToUpper(s), nil
	case "odd", "even":
		n, ok := asInt(v)
		if !ok {
			return false, fmt.Errorf("'%s' test needs an integer", name)
		}
		return (n%2 != 0) == (name == "odd"), nil
	case "divisibleby":
		n, ok1 := asInt(v)
		d, ok2 := asInt(arg())
		if !ok1 || !ok2 || d == 0 {
			return false, errors.New("divisibleby needs non-zero integers")
		}
		return n%d == 0, nil
	case "eq", "equalto", "==":
		return pyEqual(v, arg()), nil
	case "ne", "!=":
		return !pyEqual(v, arg()), nil
	case "lt", "lessthan", "<":
		return compare("<", v, arg())
	case "le", "<=":
		return compare("<=", v, arg())
	case "gt", "greaterthan", ">":
		return compare(">", v, arg())
	case "ge", ">=":
		return compare(">=", v, arg())
	case "in":
		return contains(p.get(0, "seq", nil), v)
	}
	return false, fmt.Errorf("no test named '%s'", name)
}

// maxRange is jinja2's sandbox limit on range().
const maxRange = 100000

// globalFunc returns the built-in global of that name, or nil. The
// globals Hugging Face adds (raise_exception, strftime_now) are here too.
func globalFunc(name string) callable {
	switch name {
	case "range":
		return builtinFunc(func(_ *evaluator, args []any, _ *pyDict) (any, error) {
			var n [3]int64
			n[2] = 1
			for i, a := range args {
				v, ok := asInt(a)
				if !ok || i > 2 {
					return nil, errors.New("range() arguments must be integers")
				}
				n[i] = v
			}
			start, stop, step := int64(0), n[0], n[2]
			if len(args) >= 2 {
				start, stop = n[0], n[1]
			}
			if step == 0 {
				return nil, errors.New("range() arg 3 must not be zero")
			}
			out := []any{}
			for i := start; (step > 0 && i < stop) || (step < 0 && i > stop); i += step {
				if len(out) >= maxRange {
					return nil, fmt.Errorf("range too big, maximum size for range is %d", maxRange)
				}
				out = append(out, i)
			}
			return out, nil
		})
	case "namespace", "dict":
		return builtinFunc(func(_ *evaluator, args []any, kw *pyDict) (any, error) {
			d := newPyDict()
			for _, a := range args {
				src, ok := a.(*pyDict)
				if !ok {
					return nil, fmt.Errorf("%s() positional argument must be a mapping", name)
				}
				for _, k := range src.keys {
					v, _ := src.get(k)
					_ = d.set(k, v)
				}
			}
			if kw != nil {
				for _, k := range kw.keys {
					v, _ := kw.get(k)
					_ = d.set(k, v)
				}
			}
			if name == "dict" {
				return d, nil
			}
			return &namespace{attrs: d}, nil
		})
	case "raise_exception":
		return builtinFunc(func(_ *evaluator, args []any, _ *pyDict) (any, error) {
			msg := ""
			if len(args) > 0 {
				msg = pyStr(args[0])
			}
			return nil, &raisedError{msg}
		})
	case "strftime_now":
		return builtinFunc(func(ev *evaluator, args []any, _ *pyDict) (any, error) {
			if len(args) == 0 {
				return nil, errors.New("strftime_now() needs a format")
			}
			return strftime(ev.now(), pyStr(args[0])), nil
		})
	}
	return nil
}

// percentFormat is Python's `format % args` for the conversions templates
// use: s r d i f F e E g G x X o c and %%, with flags, width, precision
// and %(name)s keys.
func percentFormat(format string, args any) (any, error) {
	var list []any
	dict, isDict := args.(*pyDict)
	if t, ok := args.(pyTuple); ok {
		list = t
	} else if !isDict {
		list = []any{args}
	}
	next := 0
	var b strings.Builder
	for i := 0; i < len(format); i++ {
		c := format[i]
		if c != '%' {
			b.WriteByte(c)
			continue
		}
		i++
		if i >= len(format) {
			return nil, errors.New("incomplete format")
		}
		var val any
		haveVal := false
		if format[i] == '(' {
			end := strings.IndexByte(format[i:], ')')
			if end < 0 || !isDict {
				return nil, errors.New("format requires a mapping")
			}
			key := format[i+1 : i+end]
			v, ok := dict.get(key)
			if !ok {
				return nil, fmt.Errorf("KeyError: %s", repr(key))
			}
			val, haveVal = v, true
			i += end + 1
		}
		j := i
		for j < len(format) && strings.IndexByte("-+ #0", format[j]) >= 0 {
			j++
		}
		flags := format[i:j]
		k := j
		for k < len(format) && (format[k] >= '0' && format[k] <= '9' || format[k] == '.') {
			k++
		}
		if k >= len(format) {
			return nil, errors.New("incomplete format")
		}
		spec, conv := format[j:k], format[k]
		i = k
		if conv == '%' {
			b.WriteByte('%')
			continue
		}
		if !haveVal {
			if next >= len(list) {
				return nil, errors.New("not enough arguments for format string")
			}
			val = list[next]
			next++
		}
		s, err := formatOne(val, flags, spec, conv)
		if err != nil {
			return nil, err
		}
		b.WriteString(s)
	}
	if !isDict && next < len(list) {
		return nil, errors.New("not all arguments converted during string formatting")
	}
	return b.String(), nil
}

func formatOne(val any, flags, spec string, conv byte) (string, error) {
	goFmt := "%" + flags + spec
	switch conv {
	case 's':
		return fmt.Sprintf("%"+strings.ReplaceAll(flags, "0", "")+spec+"s", pyStr(val)), nil
	case 'r', 'a':
		return fmt.Sprintf("%"+strings.ReplaceAll(flags, "0", "")+spec+"s", repr(val)), nil
	case 'd', 'i', 'x', 'X', 'o', 'c':
		n, ok := asInt(val)
		if f, isF := val.(float64); isF && conv != 'c' {
			n, ok = int64(f), true
		}
		if !ok {
			return "", fmt.Errorf("%%%c format: a real number is required, not %s", conv, typeName(val))
		}
		switch conv {
		case 'c':
			return string(rune(n)), nil
		case 'x', 'X', 'o':
			return fmt.Sprintf(goFmt+string(conv), n), nil
		}
		return fmt.Sprintf(goFmt+"d", n), nil
	case 'f', 'F', 'e', 'E', 'g', 'G':
		f, ok := number(val)
		if !ok {
			return "", fmt.Errorf("must be real number, not %s", typeName(val))
		}
		if !strings.Contains(spec, ".") {
			goFmt += ".6"
		}
		return fmt.Sprintf(goFmt+string(conv), f), nil
	}
	return "", fmt.Errorf("unsupported format character '%c'", conv)
}

// strFormat is str.format for {}, {0} and {name} fields with simple specs.
func strFormat(s string, p params) (any, error) {
	var b strings.Builder
	auto := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == '}' {
			if i+1 < len(s) && s[i+1] == '}' {
				i++
			}
			b.WriteByte('}')
			continue
		}
		if c != '{' {
			b.WriteByte(c)
			continue
		}
		if i+1 < len(s) && s[i+1] == '{' {
			b.WriteByte('{')
			i++
			continue
		}
		end := strings.IndexByte(s[i:], '}')
		if end < 0 {
			return nil, errors.New("single '{' encountered in format string")
		}
		field := s[i+1 : i+end]
		i += end
		name, spec, _ := strings.Cut(field, ":")
		var v any
		if name == "" {
			v = p.get(auto, "", undefined{})
			auto++
		} else if n, err := strconv.Atoi(name); err == nil {
			v = p.get(n, "", undefined{})
		} else {
			v = p.get(-1, name, undefined{})
		}
		if u, ok := v.(undefined); ok {
			return nil, fmt.Errorf("format field %q missing: %w", field, undefinedErr(u))
		}
		out := pyStr(v)
		if spec != "" {
			conv := spec[len(spec)-1]
			if strings.IndexByte("dfeEgGxXo%s", conv) >= 0 {
				r, err := formatOne(v, "", spec[:len(spec)-1], conv)
				if err != nil {
					return nil, err
				}
				out = r
			} else if w, err := strconv.Atoi(spec); err == nil {
				mode := 1
				if _, isStr := v.(string); !isStr {
					mode = 2
				}
				out = pyPad(out, w, " ", mode)
			}
		}
		b.WriteString(out)
	}
	return b.String(), nil
}

// strftime formats t as Python's datetime.strftime on glibc.
func strftime(t time.Time, format string) string {
	var b strings.Builder
	for i := 0; i < len(format); i++ {
		if format[i] != '%' || i+1 >= len(format) {
			b.WriteByte(format[i])
			continue
		}
		i++
		noPad := false
		if format[i] == '-' && i+1 < len(format) {
			noPad = true
			i++
		}
		num := func(v, width int) {
			if noPad {
				b.WriteString(strconv.Itoa(v))
			} else {
				fmt.Fprintf(&b, "%0*d", width, v)
			}
		}
		switch format[i] {
		case 'a':
			b.WriteString(t.Format("Mon"))
		case 'A':
			b.WriteString(t.Format("Monday"))
		case 'b', 'h':
			b.WriteString(t.Format("Jan"))
		case 'B':
			b.WriteString(t.Format("January"))
		case 'd':
			num(t.Day(), 2)
		case 'e':
			fmt.Fprintf(&b, "%2d", t.Day())
		case 'm':
			num(int(t.Month()), 2)
		case 'y':
			num(t.Year()%100, 2)
		case 'Y':
			b.WriteString(strconv.Itoa(t.Year()))
		case 'H':
			num(t.Hour(), 2)
		case 'I':
			num((t.Hour()+11)%12+1, 2)
		case 'p':
			b.WriteString(t.Format("PM"))
		case 'M':
			num(t.Minute(), 2)
		case 'S':
			num(t.Second(), 2)
		case 'f':
			fmt.Fprintf(&b, "%06d", t.Nanosecond()/1000)
		case 'j':
			num(t.YearDay(), 3)
		case 'w':
			b.WriteString(strconv.Itoa(int(t.Weekday())))
		case 'u':
			b.WriteString(strconv.Itoa((int(t.Weekday())+6)%7 + 1))
		case 'Z':
			b.WriteString(t.Format("MST"))
		case 'z':
			b.WriteString(t.Format("-0700"))
		case 'F':
			b.WriteString(t.Format("2006-01-02"))
		case 'T':
			b.WriteString(t.Format("15:04:05"))
		case 'D':
			b.WriteString(t.Format("01/02/06"))
		case 'c':
			b.WriteString(t.Format("Mon Jan _2 15:04:05 2006"))
		case 'x':
			b.WriteString(t.Format("01/02/06"))
		case 'X':
			b.WriteString(t.Format("15:04:05"))
		case '%':
			b.WriteByte('%')
		default:
			b.WriteByte('%')
			b.WriteByte(format[i])
		}
	}
	return b.String()
}
