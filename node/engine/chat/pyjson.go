package chat

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/nikolalohinski/gonja/v2/exec"
)

// filterToJSON is Hugging Face's tojson: Python's json.dumps with
// ensure_ascii=False, ", " and ": " separators (", " becomes "," with an
// indent), keys in insertion order, and indent / sort_keys keywords.
func filterToJSON(_ *exec.Evaluator, in *exec.Value, params *exec.VarArgs) *exec.Value {
	if in.IsError() {
		return in
	}
	indent := -1
	if v, ok := params.KwArgs["indent"]; ok && v.IsInteger() {
		indent = v.Integer()
	} else if len(params.Args) > 0 && params.Args[0].IsInteger() {
		indent = params.Args[0].Integer()
	}
	sortKeys := false
	if v, ok := params.KwArgs["sort_keys"]; ok {
		sortKeys = v.IsTrue()
	}
	var b strings.Builder
	if err := writePyJSON(&b, in.Interface(), indent, 0, sortKeys); err != nil {
		return exec.AsValue(err)
	}
	return exec.AsSafeValue(b.String())
}

// PyJSON serialises v as Python's json.dumps(v, ensure_ascii=False) would
// (", " and ": " separators), keeping the key order of JSON objects. Chat
// templates and the built-in formats print tool schemas and arguments this
// way, as models were trained on.
func PyJSON(data []byte) (string, error) {
	v := jsonValue(data, nil)
	if v == nil && strings.TrimSpace(string(data)) != "null" {
		return "", fmt.Errorf("chat: invalid JSON")
	}
	var b strings.Builder
	err := writePyJSON(&b, v, -1, 0, false)
	return b.String(), err
}

func writePyJSON(b *strings.Builder, v any, indent, depth int, sortKeys bool) error {
	itemSep, keySep := ", ", ": "
	if indent >= 0 {
		itemSep = ","
	}
	newline := func(d int) {
		if indent >= 0 {
			b.WriteByte('\n')
			b.WriteString(strings.Repeat(" ", indent*d))
		}
	}
	type kv struct {
		k string
		v any
	}
	writeObject := func(pairs []kv) error {
		if sortKeys {
			slices.SortStableFunc(pairs, func(x, y kv) int { return strings.Compare(x.k, y.k) })
		}
		if len(pairs) == 0 {
			b.WriteString("{}")
			return nil
		}
		b.WriteByte('{')
		for i, p := range pairs {
			if i > 0 {
				b.WriteString(itemSep)
			}
			newline(depth + 1)
			writePyString(b, p.k)
			b.WriteString(keySep)
			if err := writePyJSON(b, p.v, indent, depth+1, sortKeys); err != nil {
				return err
			}
		}
		newline(depth)
		b.WriteByte('}')
		return nil
	}
	switch t := v.(type) {
	case nil:
		b.WriteString("null")
		return nil
	case *exec.Value:
		return writePyJSON(b, t.Interface(), indent, depth, sortKeys)
	case *exec.Dict:
		pairs := make([]kv, len(t.Pairs))
		for i, p := range t.Pairs {
			pairs[i] = kv{p.Key.String(), p.Value.Interface()}
		}
		return writeObject(pairs)
	case exec.Dict:
		return writePyJSON(b, &t, indent, depth, sortKeys)
	case string:
		writePyString(b, t)
		return nil
	case json.Number:
		b.WriteString(string(t))
		return nil
	case bool:
		b.WriteString(strconv.FormatBool(t))
		return nil
	case float64:
		b.WriteString(pyFloat(t))
		return nil
	case float32:
		b.WriteString(pyFloat(float64(t)))
		return nil
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		b.WriteString(strconv.FormatInt(rv.Int(), 10))
		return nil
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		b.WriteString(strconv.FormatUint(rv.Uint(), 10))
		return nil
	case reflect.Slice, reflect.Array:
		if rv.Len() == 0 {
			b.WriteString("[]")
			return nil
		}
		b.WriteByte('[')
		for i := range rv.Len() {
			if i > 0 {
				b.WriteString(itemSep)
			}
			newline(depth + 1)
			if err := writePyJSON(b, rv.Index(i).Interface(), indent, depth+1, sortKeys); err != nil {
				return err
			}
		}
		newline(depth)
		b.WriteByte(']')
		return nil
	case reflect.Map:
		keys := rv.MapKeys()
		pairs := make([]kv, 0, len(keys))
		for _, k := range keys {
			pairs = append(pairs, kv{fmt.Sprint(k.Interface()), rv.MapIndex(k).Interface()})
		}
		// Go maps have no order; sort for a stable output.
		slices.SortFunc(pairs, func(x, y kv) int { return strings.Compare(x.k, y.k) })
		return writeObject(pairs)
	case reflect.Pointer:
		if rv.IsNil() {
			b.WriteString("null")
			return nil
		}
		return writePyJSON(b, rv.Elem().Interface(), indent, depth, sortKeys)
	}
	return fmt.Errorf("tojson: cannot serialise %T", v)
}

// pyFloat formats like Python's float repr.
func pyFloat(f float64) string {
	s := strconv.FormatFloat(f, 'g', -1, 64)
	if !strings.ContainsAny(s, ".eEnI") {
		s += ".0"
	}
	return s
}

// writePyString quotes s as json.dumps(ensure_ascii=False) does.
func writePyString(b *strings.Builder, s string) {
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
			if r < 0x20 {
				fmt.Fprintf(b, `\u%04x`, r)
			} else {
				b.WriteRune(r)
			}
		}
	}
	b.WriteByte('"')
}
