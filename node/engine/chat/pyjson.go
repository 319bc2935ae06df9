package chat

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// jsonOpts are json.dumps's options that Hugging Face's tojson exposes.
type jsonOpts struct {
	ensureASCII     bool
	indent          *string // nil: no newlines
	itemSep, keySep string
	sortKeys        bool
}

// toJSONFilter is the tojson Hugging Face installs for chat templates:
// json.dumps(x, ensure_ascii=False, indent=None, separators=None,
// sort_keys=False), with those keywords (or positionals) honoured.
func toJSONFilter(v any, p params) (any, error) {
	o := jsonOpts{ensureASCII: truthy(p.get(0, "ensure_ascii", false)), sortKeys: truthy(p.get(3, "sort_keys", false))}
	switch t := p.get(1, "indent", nil).(type) {
	case nil:
	case int64:
		s := strings.Repeat(" ", int(max(t, 0)))
		o.indent = &s
	case string:
		o.indent = &t
	default:
		return nil, fmt.Errorf("tojson: indent must be an int or a string, not %s", typeName(t))
	}
	o.itemSep, o.keySep = ", ", ": "
	if o.indent != nil {
		o.itemSep = ","
	}
	if sep := p.get(2, "separators", nil); sep != nil {
		items, err := iterate(sep)
		if err != nil || len(items) != 2 {
			return nil, fmt.Errorf("tojson: separators must be a pair of strings")
		}
		a, ok1 := items[0].(string)
		b, ok2 := items[1].(string)
		if !ok1 || !ok2 {
			return nil, fmt.Errorf("tojson: separators must be a pair of strings")
		}
		o.itemSep, o.keySep = a, b
	}
	var b strings.Builder
	if err := writePyJSON(&b, v, &o, 0); err != nil {
		return nil, err
	}
	return b.String(), nil
}

func defaultJSONOpts() *jsonOpts { return &jsonOpts{itemSep: ", ", keySep: ": "} }

// writePyJSON writes v as Python's json.dumps(v, ensure_ascii=False)
// would under o (by default ", " and ": " separators), key order kept,
// numbers as Python reads them (1.50 becomes 1.5). Chat templates and the
// built-in formats print tool schemas and arguments this way, as models
// were trained on.
func writePyJSON(b *strings.Builder, v any, o *jsonOpts, depth int) error {
	newline := func(d int) {
		if o.indent != nil {
			b.WriteByte('\n')
			b.WriteString(strings.Repeat(*o.indent, d))
		}
	}
	writeSeq := func(open, close byte, n int, item func(i int) error) error {
		if n == 0 {
			b.WriteByte(open)
			b.WriteByte(close)
			return nil
		}
		b.WriteByte(open)
		for i := range n {
			if i > 0 {
				b.WriteString(o.itemSep)
			}
			newline(depth + 1)
			if err := item(i); err != nil {
				return err
			}
		}
		newline(depth)
		b.WriteByte(close)
		return nil
	}
	switch t := v.(type) {
	case nil:
		b.WriteString("null")
	case bool:
		b.WriteString(strconv.FormatBool(t))
	case int64:
		b.WriteString(strconv.FormatInt(t, 10))
	case float64:
		switch {
		case math.IsNaN(t):
			b.WriteString("NaN")
		case math.IsInf(t, 1):
			b.WriteString("Infinity")
		case math.IsInf(t, -1):
			b.WriteString("-Infinity")
		default:
			b.WriteString(pyFloat(t))
		}
	case string:
		writeJSONString(b, t, o.ensureASCII)
	case []any:
		return writeSeq('[', ']', len(t), func(i int) error { return writePyJSON(b, t[i], o, depth+1) })
	case pyTuple:
		return writeSeq('[', ']', len(t), func(i int) error { return writePyJSON(b, t[i], o, depth+1) })
	case *pyDict:
		keys := append([]any(nil), t.keys...)
		if o.sortKeys {
			if err := sortValues(keys, func(k any) any { return k }, false); err != nil {
				return err
			}
		}
		return writeSeq('{', '}', len(keys), func(i int) error {
			k := keys[i]
			switch kt := k.(type) {
			case string:
				writeJSONString(b, kt, o.ensureASCII)
			case nil, bool, int64, float64:
				var kb strings.Builder
				if err := writePyJSON(&kb, kt, o, 0); err != nil {
					return err
				}
				writeJSONString(b, kb.String(), o.ensureASCII)
			default:
				return fmt.Errorf("keys must be str, int, float, bool or None, not %s", typeName(k))
			}
			b.WriteString(o.keySep)
			x, _ := t.get(k)
			return writePyJSON(b, x, o, depth+1)
		})
	default:
		//lint:ignore ST1005 Python's json.dumps message, matched for template parity
		return fmt.Errorf("Object of type %s is not JSON serializable", typeName(v))
	}
	return nil
}

// writePyString quotes s as json.dumps(ensure_ascii=False) does.
func writePyString(b *strings.Builder, s string) { writeJSONString(b, s, false) }

// writeJSONString quotes s as json.dumps does, escaping non-ASCII
// characters only with ensureASCII.
func writeJSONString(b *strings.Builder, s string, ensureASCII bool) {
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		default:
			switch {
			case r < 0x20:
				fmt.Fprintf(b, `\u%04x`, r)
			case ensureASCII && r > 0x7e:
				if r > 0xffff {
					r -= 0x10000
					fmt.Fprintf(b, `\u%04x\u%04x`, 0xd800+(r>>10), 0xdc00+(r&0x3ff))
				} else {
					fmt.Fprintf(b, `\u%04x`, r)
				}
			default:
				b.WriteRune(r)
			}
		}
	}
	b.WriteByte('"')
}

// jsonValue decodes JSON as Python's json.loads does into template values:
// objects as insertion-ordered dicts, integers as int64 and other numbers
// as float64. ok is false for invalid JSON.
func jsonValue(data []byte) (v any, ok bool) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	v, err := decodeOrdered(dec)
	if err != nil {
		return nil, false
	}
	if _, err := dec.Token(); err == nil {
		return nil, false // trailing data
	}
	return v, true
}

func decodeOrdered(dec *json.Decoder) (any, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			d := newPyDict()
			for dec.More() {
				k, err := dec.Token()
				if err != nil {
					return nil, err
				}
				v, err := decodeOrdered(dec)
				if err != nil {
					return nil, err
				}
				_ = d.set(k.(string), v)
			}
			_, err := dec.Token()
			return d, err
		case '[':
			list := []any{}
			for dec.More() {
				v, err := decodeOrdered(dec)
				if err != nil {
					return nil, err
				}
				list = append(list, v)
			}
			_, err := dec.Token()
			return list, err
		}
		return nil, fmt.Errorf("unexpected %v", t)
	case json.Number:
		s := string(t)
		if !strings.ContainsAny(s, ".eE") {
			if n, err := strconv.ParseInt(s, 10, 64); err == nil {
				return n, nil
			}
		}
		f, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return nil, err
		}
		return f, nil
	}
	return tok, nil
}
