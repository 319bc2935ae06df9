package chat

import (
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"unicode"
)

// params reads a builtin's arguments by position or keyword, Python style.
type params struct {
	args []any
	kw   *pyDict
}

// get returns argument i (positional) or name (keyword), or def.
func (p params) get(i int, name string, def any) any {
	if i >= 0 && i < len(p.args) {
		return p.args[i]
	}
	if p.kw != nil {
		if v, ok := p.kw.get(name); ok {
			return v
		}
	}
	return def
}

func (ev *evaluator) filter(f *filterExpr, v any) (any, error) {
	args, kw, err := ev.evalArgs(&f.call)
	if err != nil {
		return nil, err
	}
	return ev.applyFilter(f.name, v, params{args, kw})
}

// attrGetter resolves "a.b.0" paths as jinja2's make_attrgetter does.
func attrGetter(attr any) func(any) (any, error) {
	path := []any{attr}
	if s, ok := attr.(string); ok {
		path = nil
		for _, part := range strings.Split(s, ".") {
			if n, err := strconv.ParseInt(part, 10, 64); err == nil {
				path = append(path, n)
			} else {
				path = append(path, part)
			}
		}
	}
	return func(v any) (any, error) {
		for _, k := range path {
			var err error
			if v, err = getItem(v, k); err != nil {
				return nil, err
			}
		}
		return v, nil
	}
}

func (ev *evaluator) applyFilter(name string, v any, p params) (any, error) {
	switch name {
	case "tojson":
		return toJSONFilter(v, p)
	case "trim":
		return pyStrip(pyStr(v), p.get(0, "chars", nil), true, true)
	case "length", "count":
		return pyLen(v)
	case "string":
		return pyStr(v), nil
	case "safe", "forceescape", "e", "escape":
		if name == "safe" {
			return v, nil
		}
		return htmlEscape(pyStr(v)), nil
	case "upper":
		return strings.ToUpper(pyStr(v)), nil
	case "lower":
		return strings.ToLower(pyStr(v)), nil
	case "capitalize":
		return pyCapitalize(pyStr(v)), nil
	case "title":
		return jinjaTitle(pyStr(v)), nil
	case "default", "d":
		def := p.get(0, "default_value", "")
		_, isUndef := v.(undefined)
		if isUndef || truthy(p.get(1, "boolean", false)) && !truthy(v) {
			return def, nil
		}
		return v, nil
	case "first", "last":
		items, err := iterate(v)
		if err != nil {
			return nil, err
		}
		if len(items) == 0 {
			return undefined{"no " + name + " item"}, nil
		}
		if name == "first" {
			return items[0], nil
		}
		return items[len(items)-1], nil
	case "list":
		items, err := iterate(v)
		return append([]any{}, items...), err
	case "items":
		switch t := v.(type) {
		case undefined:
			return []any{}, nil
		case *pyDict:
			return t.items(), nil
		}
		return nil, fmt.Errorf("can only get item pairs from a mapping")
	case "join":
		return joinFilter(v, p)
	case "replace":
		s := pyStr(v)
		return pyReplace(s, pyStr(p.get(0, "old", "")), pyStr(p.get(1, "new", "")), p.get(2, "count", nil))
	case "indent":
		return indentFilter(pyStr(v), p), nil
	case "int":
		return intFilter(v, p), nil
	case "float":
		return floatFilter(v, p.get(0, "default", 0.0)), nil
	case "abs":
		switch t := v.(type) {
		case int64:
			if t < 0 {
				return -t, nil
			}
			return t, nil
		case float64:
			return math.Abs(t), nil
		case bool:
			n, _ := asInt(t)
			return n, nil
		}
		return nil, fmt.Errorf("bad operand type for abs(): '%s'", typeName(v))
	case "round":
		return roundFilter(v, p)
	case "selectattr", "rejectattr", "select", "reject":
		return ev.selectFilter(name, v, p)
	case "map":
		return ev.mapFilter(v, p)
	case "unique":
		return uniqueFilter(v, p)
	case "sort":
		return sortFilter(v, p)
	case "dictsort":
		return dictsortFilter(v, p)
	case "reverse":
		if s, ok := v.(string); ok {
			r := []rune(s)
			for i, j := 0, len(r)-1; i < j; i, j = i+1, j-1 {
				r[i], r[j] = r[j], r[i]
			}
			return string(r), nil
		}
		items, err := iterate(v)
		if err != nil {
			return nil, err
		}
		out := make([]any, len(items))
		for i, x := range items {
			out[len(items)-1-i] = x
		}
		return out, nil
	case "sum":
		return sumFilter(v, p)
	case "min", "max":
		return minMaxFilter(name, v, p)
	case "attr":
		return getAttr(v, pyStr(p.get(0, "name", "")))
	case "format":
		if len(p.args) == 1 {
			return percentFormat(pyStr(v), p.args[0])
		}
		return percentFormat(pyStr(v), pyTuple(p.args))
	case "center":
		w, _ := asInt(p.get(0, "width", int64(80)))
		return pyPad(pyStr(v), int(w), " ", 0), nil
	case "wordcount":
		return int64(len(strings.FieldsFunc(pyStr(v), func(r rune) bool { return !unicode.IsLetter(r) && !unicode.IsDigit(r) && r != '_' }))), nil
	case "batch":
		return batchFilter(v, p)
	case "truncate":
		return truncateFilter(pyStr(v), p), nil
	}
	return nil, fmt.Errorf("no filter named '%s'", name)
}

func htmlEscape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&#34;", "'", "&#39;").Replace(s)
}

func pyCapitalize(s string) string {
	r := []rune(s)
	if len(r) == 0 {
		return s
	}
	return string(unicode.ToTitle(r[0])) + strings.ToLower(string(r[1:]))
}

// jinjaTitle is jinja2's title filter: each word after -, whitespace or
// an opening bracket gets its first letter upper-cased and the rest lower.
func jinjaTitle(s string) string {
	re := regexp.MustCompile(`([-\s({\[<]+)`)
	var b strings.Builder
	last := 0
	word := func(w string) {
		r := []rune(w)
		if len(r) > 0 {
			b.WriteString(strings.ToUpper(string(r[0])) + strings.ToLower(string(r[1:])))
		}
	}
	for _, m := range re.FindAllStringIndex(s, -1) {
		word(s[last:m[0]])
		b.WriteString(s[m[0]:m[1]])
		last = m[1]
	}
	word(s[last:])
	return b.String()
}

func joinFilter(v any, p params) (any, error) {
	items, err := iterate(v)
	if err != nil {
		return nil, err
	}
	if attr := p.get(1, "attribute", nil); attr != nil {
		get := attrGetter(attr)
		items = append([]any(nil), items...)
		for i, x := range items {
			if items[i], err = get(x); err != nil {
				return nil, err
			}
		}
	}
	parts := make([]string, len(items))
	for i, x := range items {
		parts[i] = pyStr(x)
	}
	return strings.Join(parts, pyStr(p.get(0, "d", ""))), nil
}

func indentFilter(s string, p params) string {
	ind := "    "
	switch w := p.get(0, "width", int64(4)).(type) {
	case string:
		ind = w
	case int64:
		ind = strings.Repeat(" ", int(max(w, 0)))
	}
	first, blank := truthy(p.get(1, "first", false)), truthy(p.get(2, "blank", false))
	s += "\n"
	lines := pySplitlines(s, false)
	var rv string
	if blank {
		rv = strings.Join(lines, "\n"+ind)
	} else {
		rv = lines[0]
		if len(lines) > 1 {
			rest := make([]string, len(lines)-1)
			for i, l := range lines[1:] {
				if l != "" {
					l = ind + l
				}
				rest[i] = l
			}
			rv += "\n" + strings.Join(rest, "\n")
		}
	}
	if first {
		rv = ind + rv
	}
	return rv
}

func intFilter(v any, p params) any {
	def := p.get(0, "default", int64(0))
	base, _ := asInt(p.get(1, "base", int64(10)))
	switch t := v.(type) {
	case int64:
		return t
	case bool:
		n, _ := asInt(t)
		return n
	case float64:
		return int64(t)
	case string:
		s := strings.TrimFunc(strings.ReplaceAll(t, "_", ""), pyIsSpace)
		if n, err := strconv.ParseInt(s, int(base), 64); err == nil {
			return n
		}
		if f, err := strconv.ParseFloat(s, 64); err == nil {
			return int64(f)
		}
	}
	return def
}

func floatFilter(v any, def any) any {
	switch t := v.(type) {
	case float64:
		return t
	case int64, bool:
		f, _ := number(t)
		return f
	case string:
		if f, err := strconv.ParseFloat(strings.TrimFunc(t, pyIsSpace), 64); err == nil {
			return f
		}
	}
	return def
}

func roundFilter(v any, p params) (any, error) {
	f, ok := number(v)
	if !ok {
		return nil, fmt.Errorf("type %s doesn't define __round__ method", typeName(v))
	}
	prec, _ := asInt(p.get(0, "precision", int64(0)))
	method := pyStr(p.get(1, "method", "common"))
	scale := math.Pow(10, float64(prec))
	switch method {
	case "common":
		if _, isInt := v.(int64); isInt {
			return v, nil
		}
		f = math.RoundToEven(f*scale) / scale
	case "ceil":
		f = math.Ceil(f*scale) / scale
	case "floor":
		f = math.Floor(f*scale) / scale
	default:
		return nil, fmt.Errorf("method must be common, ceil or floor")
	}
	return f, nil
}

// selectFilter is select/reject (a test on each item) and
// selectattr/rejectattr (a test on an attribute of each item).
func (ev *evaluator) selectFilter(name string, v any, p params) (any, error) {
	items, err := iterate(v)
	if err != nil {
		return nil, err
	}
	args := p.args
	get := func(x any) (any, error) { return x, nil }
	if strings.HasSuffix(name, "attr") {
		if len(args) == 0 {
			return nil, fmt.Errorf("missing parameter for attribute name")
		}
		get = attrGetter(args[0])
		args = args[1:]
	}
	testName := ""
	if len(args) > 0 {
		testName = pyStr(args[0])
		args = args[1:]
	}
	want := strings.HasPrefix(name, "select")
	out := []any{}
	for _, x := range items {
		val, err := get(x)
		if err != nil {
			return nil, err
		}
		var ok bool
		if testName == "" {
			ok = truthy(val)
		} else if ok, err = ev.test(testName, val, args, nil); err != nil {
			return nil, err
		}
		if ok == want {
			out = append(out, x)
		}
	}
	return out, nil
}

func (ev *evaluator) mapFilter(v any, p params) (any, error) {
	items, err := iterate(v)
	if err != nil {
		return nil, err
	}
	out := make([]any, 0, len(items))
	if attr := p.get(-1, "attribute", nil); attr != nil {
		get := attrGetter(attr)
		def := p.get(-1, "default", nil)
		for _, x := range items {
			y, err := get(x)
			if err != nil {
				return nil, err
			}
			if _, undef := y.(undefined); undef && def != nil {
				y = def
			}
			out = append(out, y)
		}
		return out, nil
	}
	if len(p.args) == 0 {
		return nil, fmt.Errorf("map requires a filter name or attribute")
	}
	fname := pyStr(p.args[0])
	for _, x := range items {
		y, err := ev.applyFilter(fname, x, params{p.args[1:], p.kw})
		if err != nil {
			return nil, err
		}
		out = append(out, y)
	}
	return out, nil
}

// sortKey lower-cases strings unless sorting is case sensitive.
func sortKey(caseSensitive bool, get func(any) (any, error)) func(any) any {
	return func(x any) any {
		if get != nil {
			x, _ = get(x)
		}
		if s, ok := x.(string); ok && !caseSensitive {
			return strings.ToLower(s)
		}
		return x
	}
}

func uniqueFilter(v any, p params) (any, error) {
	items, err := iterate(v)
	if err != nil {
		return nil, err
	}
	var get func(any) (any, error)
	if a := p.get(1, "attribute", nil); a != nil {
		get = attrGetter(a)
	}
	key := sortKey(truthy(p.get(0, "case_sensitive", false)), get)
	out := []any{}
	var seen []any
	for _, x := range items {
		k := key(x)
		dup := false
		for _, s := range seen {
			dup = dup || pyEqual(s, k)
		}
		if !dup {
			seen = append(seen, k)
			out = append(out, x)
		}
	}
	return out, nil
}

func sortFilter(v any, p params) (any, error) {
	items, err := iterate(v)
	if err != nil {
		return nil, err
	}
	out := append([]any{}, items...)
	var get func(any) (any, error)
	if a := p.get(2, "attribute", nil); a != nil {
		get = attrGetter(a)
	}
	err = sortValues(out, sortKey(truthy(p.get(1, "case_sensitive", false)), get), truthy(p.get(0, "reverse", false)))
	return out, err
}

func dictsortFilter(v any, p params) (any, error) {
	d, ok := v.(*pyDict)
	if !ok {
		return nil, fmt.Errorf("dictsort needs a mapping")
	}
	pos := 0
	if pyStr(p.get(1, "by", "key")) == "value" {
		pos = 1
	}
	cs := truthy(p.get(0, "case_sensitive", false))
	items := d.items()
	key := sortKey(cs, nil)
	err := sortValues(items, func(x any) any { return key(x.(pyTuple)[pos]) }, truthy(p.get(2, "reverse", false)))
	return items, err
}

func sumFilter(v any, p params) (any, error) {
	items, err := iterate(v)
	if err != nil {
		return nil, err
	}
	total := p.get(1, "start", int64(0))
	var get func(any) (any, error)
	if a := p.get(0, "attribute", nil); a != nil {
		get = attrGetter(a)
	}
	for _, x := range items {
		if get != nil {
			if x, err = get(x); err != nil {
				return nil, err
			}
		}
		if total, err = arith("+", total, x); err != nil {
			return nil, err
		}
	}
	return total, nil
}

func minMaxFilter(name string, v any, p params) (any, error) {
	items, err := iterate(v)
	if err != nil {
		return nil, err
	}
	if len(items) == 0 {
		return undefined{"no " + name + " item, sequence was empty"}, nil
	}
	var get func(any) (any, error)
	if a := p.get(1, "attribute", nil); a != nil {
		get = attrGetter(a)
	}
	key := sortKey(truthy(p.get(0, "case_sensitive", false)), get)
	best := items[0]
	for _, x := range items[1:] {
		c, err := pyCompare(key(x), key(best))
		if err != nil {
			return nil, err
		}
		if (name == "min" && c < 0) || (name == "max" && c > 0) {
			best = x
		}
	}
	return best, nil
}

func batchFilter(v any, p params) (any, error) {
	items, err := iterate(v)
	if err != nil {
		return nil, err
	}
	n, _ := asInt(p.get(0, "linecount", int64(1)))
	if n <= 0 {
		return nil, fmt.Errorf("batch size must be positive")
	}
	fill := p.get(1, "fill_with", nil)
	out := []any{}
	for i := 0; i < len(items); i += int(n) {
		row := append([]any{}, items[i:min(i+int(n), len(items))]...)
		for fill != nil && len(row) < int(n) {
			row = append(row, fill)
		}
		out = append(out, row)
	}
	return out, nil
}

func truncateFilter(s string, p params) string {
	length, _ := asInt(p.get(0, "length", int64(255)))
	killwords := truthy(p.get(1, "killwords", false))
	end := pyStr(p.get(2, "end", "..."))
	leeway, _ := asInt(p.get(3, "leeway", int64(5)))
	r := []rune(s)
	if int64(len(r)) <= length+leeway {
		return s
	}
	keep := int(length) - runeLen(end)
	if keep < 0 {
		keep = 0
	}
	if killwords {
		return string(r[:keep]) + end
	}
	cut := string(r[:keep])
	if i := strings.LastIndex(cut, " "); i >= 0 {
		cut = cut[:i]
	}
	return cut + end
}
