package chat

import (
	"errors"
	"fmt"
	"strings"
	"unicode"
)

// method returns obj.name as a bound method when obj's Python type has
// that method, else nil. Methods that would mutate a list or dict fail
// when called, as in jinja2's ImmutableSandboxedEnvironment.
func method(obj any, name string) callable {
	switch t := obj.(type) {
	case string:
		if isStrMethod(name) {
			return builtinFunc(func(ev *evaluator, args []any, kw *pyDict) (any, error) {
				return strMethod(t, name, params{args, kw})
			})
		}
	case *pyDict:
		switch name {
		case "keys", "values", "items", "get", "copy":
			return builtinFunc(func(_ *evaluator, args []any, kw *pyDict) (any, error) {
				return dictMethod(t, name, params{args, kw})
			})
		case "pop", "popitem", "setdefault", "update", "clear":
			return unsafeMethod("dict", name)
		}
	case []any, pyTuple:
		items, _ := iterate(t)
		switch name {
		case "index", "count":
			return builtinFunc(func(_ *evaluator, args []any, _ *pyDict) (any, error) {
				if len(args) == 0 {
					return nil, fmt.Errorf("%s() takes exactly one argument", name)
				}
				n := int64(0)
				for i, x := range items {
					if pyEqual(x, args[0]) {
						if name == "index" {
							return int64(i), nil
						}
						n++
					}
				}
				if name == "index" {
					return nil, fmt.Errorf("%s is not in list", repr(args[0]))
				}
				return n, nil
			})
		case "append", "extend", "insert", "pop", "remove", "reverse", "sort", "clear":
			if _, isList := t.([]any); isList {
				return unsafeMethod("list", name)
			}
		}
	}
	return nil
}

func unsafeMethod(typ, name string) callable {
	return builtinFunc(func(*evaluator, []any, *pyDict) (any, error) {
		return nil, fmt.Errorf("access to attribute '%s' of '%s' object is unsafe", name, typ)
	})
}

func dictMethod(d *pyDict, name string, p params) (any, error) {
	switch name {
	case "keys":
		return append([]any{}, d.keys...), nil
	case "values":
		out := make([]any, len(d.keys))
		for i, k := range d.keys {
			out[i], _ = d.get(k)
		}
		return out, nil
	case "items":
		return d.items(), nil
	case "copy":
		return d.copy(), nil
	}
	if v, ok := d.get(p.get(0, "key", nil)); ok {
		return v, nil
	}
	return p.get(1, "default", nil), nil
}

func isStrMethod(name string) bool {
	switch name {
	case "strip", "lstrip", "rstrip", "split", "rsplit", "splitlines", "startswith", "endswith",
		"replace", "upper", "lower", "title", "capitalize", "swapcase", "casefold", "find", "rfind",
		"index", "rindex", "count", "join", "format", "isdigit", "isalpha", "isalnum", "isspace",
		"isupper", "islower", "isnumeric", "isdecimal", "istitle", "zfill", "center", "ljust", "rjust",
		"partition", "rpartition", "removeprefix", "removesuffix":
		return true
	}
	return false
}

func strArg(v any, what string) (string, error) {
	s, ok := v.(string)
	if !ok {
		return "", fmt.Errorf("%s must be str, not %s", what, typeName(v))
	}
	return s, nil
}

func strMethod(s, name string, p params) (any, error) {
	switch name {
	case "strip":
		return pyStrip(s, p.get(0, "chars", nil), true, true)
	case "lstrip":
		return pyStrip(s, p.get(0, "chars", nil), true, false)
	case "rstrip":
		return pyStrip(s, p.get(0, "chars", nil), false, true)
	case "split", "rsplit":
		n, _ := asInt(p.get(1, "maxsplit", int64(-1)))
		sep := p.get(0, "sep", nil)
		if sep == nil {
			return toList(pySplitWS(s, int(n), name == "rsplit")), nil
		}
		sp, err := strArg(sep, "sep")
		if err != nil {
			return nil, err
		}
		if sp == "" {
			return nil, errors.New("empty separator")
		}
		if name == "split" || n < 0 {
			if n < 0 {
				return toList(strings.Split(s, sp)), nil
			}
			return toList(strings.SplitN(s, sp, int(n)+1)), nil
		}
		var parts []string
		rest := s
		for ; n > 0; n-- {
			i := strings.LastIndex(rest, sp)
			if i < 0 {
				break
			}
			parts = append([]string{rest[i+len(sp):]}, parts...)
			rest = rest[:i]
		}
		return toList(append([]string{rest}, parts...)), nil
	case "splitlines":
		return toList(pySplitlines(s, truthy(p.get(0, "keepends", false)))), nil
	case "startswith", "endswith":
		return affix(s, name == "startswith", p)
	case "replace":
		old, err := strArg(p.get(0, "old", nil), "replace() argument 1")
		if err != nil {
			return nil, err
		}
		nw, err := strArg(p.get(1, "new", nil), "replace() argument 2")
		if err != nil {
			return nil, err
		}
		return pyReplace(s, old, nw, p.get(2, "count", nil))
	case "upper":
		return strings.ToUpper(s), nil
	case "lower", "casefold":
		return strings.ToLower(s), nil
	case "title":
		var b strings.Builder
		prevCased := false
		for _, r := range s {
			cased := unicode.IsUpper(r) || unicode.IsLower(r) || unicode.IsTitle(r)
			switch {
			case cased && !prevCased:
				b.WriteRune(unicode.ToTitle(r))
			case cased:
				b.WriteRune(unicode.ToLower(r))
			default:
				b.WriteRune(r)
			}
			prevCased = cased
		}
		return b.String(), nil
	case "capitalize":
		return pyCapitalize(s), nil
	case "swapcase":
		return strings.Map(func(r rune) rune {
			if unicode.IsUpper(r) {
				return unicode.ToLower(r)
			}
			return unicode.ToUpper(r)
		}, s), nil
	case "find", "rfind", "index", "rindex", "count":
		sub, err := strArg(p.get(0, "sub", nil), "argument")
		if err != nil {
			return nil, err
		}
		i := -1
		switch name {
		case "count":
			if sub == "" {
				return int64(runeLen(s) + 1), nil
			}
			return int64(strings.Count(s, sub)), nil
		case "find", "index":
			i = strings.Index(s, sub)
		default:
			i = strings.LastIndex(s, sub)
		}
		if i < 0 {
			if strings.HasSuffix(name, "index") {
				return nil, errors.New("substring not found")
			}
			return int64(-1), nil
		}
		return int64(runeLen(s[:i])), nil
	case "join":
		items, err := iterate(p.get(0, "iterable", []any{}))
		if err != nil {
			return nil, err
		}
		parts := make([]string, len(items))
		for i, x := range items {
			if parts[i], err = strArg(x, fmt.Sprintf("sequence item %d", i)); err != nil {
				return nil, err
			}
		}
		return strings.Join(parts, s), nil
	case "format":
		return strFormat(s, p)
	case "isdigit", "isnumeric", "isdecimal":
		return s != "" && strings.IndexFunc(s, func(r rune) bool { return !unicode.IsDigit(r) }) < 0, nil
	case "isalpha":
		return s != "" && strings.IndexFunc(s, func(r rune) bool { return !unicode.IsLetter(r) }) < 0, nil
	case "isalnum":
		return s != "" && strings.IndexFunc(s, func(r rune) bool { return !unicode.IsLetter(r) && !unicode.IsDigit(r) }) < 0, nil
	case "isspace":
		return s != "" && strings.IndexFunc(s, func(r rune) bool { return !pyIsSpace(r) }) < 0, nil
	case "isupper", "islower":
		hasCased, ok := false, true
		for _, r := range s {
			if unicode.IsUpper(r) || unicode.IsLower(r) {
				hasCased = true
				ok = ok && (unicode.IsUpper(r) == (name == "isupper"))
			}
		}
		return hasCased && ok, nil
	case "istitle":
		t, _ := strMethod(s, "title", p)
		return s != "" && t == s && strings.ToLower(s) != s, nil
	case "zfill":
		w, _ := asInt(p.get(0, "width", int64(0)))
		sign := ""
		if strings.HasPrefix(s, "-") || strings.HasPrefix(s, "+") {
			sign, s = s[:1], s[1:]
		}
		if pad := int(w) - runeLen(s) - len(sign); pad > 0 {
			s = strings.Repeat("0", pad) + s
		}
		return sign + s, nil
	case "center", "ljust", "rjust":
		w, _ := asInt(p.get(0, "width", int64(0)))
		fill := pyStr(p.get(1, "fillchar", " "))
		mode := map[string]int{"center": 0, "ljust": 1, "rjust": 2}[name]
		return pyPad(s, int(w), fill, mode), nil
	case "partition", "rpartition":
		sep, err := strArg(p.get(0, "sep", nil), "sep")
		if err != nil {
			return nil, err
		}
		i := strings.Index(s, sep)
		if name == "rpartition" {
			i = strings.LastIndex(s, sep)
		}
		if i < 0 {
			if name == "rpartition" {
				return pyTuple{"", "", s}, nil
			}
			return pyTuple{s, "", ""}, nil
		}
		return pyTuple{s[:i], sep, s[i+len(sep):]}, nil
	case "removeprefix":
		return strings.TrimPrefix(s, pyStr(p.get(0, "prefix", ""))), nil
	case "removesuffix":
		return strings.TrimSuffix(s, pyStr(p.get(0, "suffix", ""))), nil
	}
	return nil, fmt.Errorf("'str' object has no attribute '%s'", name)
}

func toList(parts []string) []any {
	out := make([]any, len(parts))
	for i, s := range parts {
		out[i] = s
	}
	return out
}

// pyStrip is str.strip/lstrip/rstrip: whitespace, or any of chars.
func pyStrip(s string, chars any, left, right bool) (any, error) {
	cut := pyIsSpace
	if chars != nil {
		if u, ok := chars.(undefined); ok {
			return nil, undefinedErr(u)
		}
		set, err := strArg(chars, "strip arg")
		if err != nil {
			return nil, err
		}
		cut = func(r rune) bool { return strings.ContainsRune(set, r) }
	}
	if left {
		s = strings.TrimLeftFunc(s, cut)
	}
	if right {
		s = strings.TrimRightFunc(s, cut)
	}
	return s, nil
}

// pySplitWS is str.split() / rsplit() without a separator.
func pySplitWS(s string, maxsplit int, fromRight bool) []string {
	fields := strings.FieldsFunc(s, pyIsSpace)
	if maxsplit < 0 || len(fields) <= maxsplit+1 {
		return fields
	}
	if !fromRight {
		rest := strings.TrimLeftFunc(s, pyIsSpace)
		out := make([]string, 0, maxsplit+1)
		for range maxsplit {
			i := strings.IndexFunc(rest, pyIsSpace)
			out = append(out, rest[:i])
			rest = strings.TrimLeftFunc(rest[i:], pyIsSpace)
		}
		return append(out, rest)
	}
	rest := strings.TrimRightFunc(s, pyIsSpace)
	var out []string
	for range maxsplit {
		i := strings.LastIndexFunc(rest, pyIsSpace)
		out = append([]string{rest[i+1:]}, out...)
		rest = strings.TrimRightFunc(rest[:i], pyIsSpace)
	}
	return append([]string{rest}, out...)
}

// pySplitlines is str.splitlines.
func pySplitlines(s string, keepends bool) []string {
	var out []string
	start := 0
	rs := []rune(s)
	for i := 0; i < len(rs); i++ {
		r := rs[i]
		switch r {
		case '\n', '\r', '\v', '\f', 0x1c, 0x1d, 0x1e, 0x85, 0x2028, 0x2029:
		default:
			continue
		}
		end := i + 1
		if r == '\r' && i+1 < len(rs) && rs[i+1] == '\n' {
			end++
		}
		if keepends {
			out = append(out, string(rs[start:end]))
		} else {
			out = append(out, string(rs[start:i]))
		}
		start = end
		i = end - 1
	}
	if start < len(rs) {
		out = append(out, string(rs[start:]))
	}
	return out
}

func affix(s string, prefix bool, p params) (any, error) {
	rs := []rune(s)
	lo, hi := int64(0), int64(len(rs))
	if v, ok := asInt(p.get(1, "start", nil)); ok {
		lo = v
	}
	if v, ok := asInt(p.get(2, "end", nil)); ok {
		hi = v
	}
	sub, _ := sliceValue(s, &lo, &hi, nil)
	s = sub.(string)
	var cands []any
	switch t := p.get(0, "prefix", nil).(type) {
	case string:
		cands = []any{t}
	case pyTuple:
		cands = t
	default:
		return nil, fmt.Errorf("startswith first arg must be str or a tuple of str, not %s", typeName(t))
	}
	for _, c := range cands {
		cs, err := strArg(c, "argument")
		if err != nil {
			return nil, err
		}
		if prefix && strings.HasPrefix(s, cs) || !prefix && strings.HasSuffix(s, cs) {
			return true, nil
		}
	}
	return false, nil
}

// pyReplace is str.replace with an optional count.
func pyReplace(s, old, nw string, count any) (any, error) {
	n := -1
	if c, ok := asInt(count); ok && c >= 0 {
		n = int(c)
	}
	if old == "" {
		rs := []rune(s)
		var b strings.Builder
		done := 0
		for i := 0; i <= len(rs); i++ {
			if n < 0 || done < n {
				b.WriteString(nw)
				done++
			}
			if i < len(rs) {
				b.WriteRune(rs[i])
			}
		}
		return b.String(), nil
	}
	return strings.Replace(s, old, nw, n), nil
}

// pyPad centres (mode 0), left-justifies (1) or right-justifies (2) s.
func pyPad(s string, width int, fill string, mode int) string {
	n := width - runeLen(s)
	if n <= 0 || fill == "" {
		return s
	}
	switch mode {
	case 1:
		return s + strings.Repeat(fill, n)
	case 2:
		return strings.Repeat(fill, n) + s
	}
	left := n / 2
	if n%2 == 1 && width%2 == 1 {
		left++
	}
	return strings.Repeat(fill, left) + s + strings.Repeat(fill, n-left)
}
