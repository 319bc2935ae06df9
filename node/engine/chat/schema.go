package chat

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// kind is what a grammar node accepts.
type kind uint8

const (
	kAny     kind = iota // any JSON value
	kObject              // an object: declared properties in order, or any keys (free)
	kArray               // an array of items
	kString              // a string
	kNumber              // a number
	kInteger             // a number without fraction or exponent
	kLiteral             // one of a fixed set of JSON texts (enum, const, true/false, null)
	kUnion               // one of several nodes that differ in their first byte
)

// Node is a compiled JSON schema (or a plain "any JSON" / "any object")
// the automaton follows. Nodes form a graph ($ref may make it cyclic) and
// are immutable once compiled.
type Node struct {
	kind kind

	// kObject
	props        []prop
	free         bool     // any keys, any values
	keySets      []keySet // keySets[i]: the keys allowed when props[:i] are behind
	lastRequired int      // index of the last required property, -1 if none
	reqSum       []int    // reqSum[i]: bytes of `,"k":v` for every required prop >= i
	reqCount     []int

	// kArray
	items              *Node
	minItems, maxItems int // maxItems < 0: unbounded

	// kString (in characters)
	minLen, maxLen int // maxLen < 0: unbounded

	// kLiteral: JSON texts, sorted
	literals []string

	// kUnion
	alts       []*Node
	unionIndex [256]int8 // first byte -> branch, -1: none

	minSize int // bytes of the shortest text this node accepts
	ref     string
}

// prop is a declared object property.
type prop struct {
	name     string
	key      string // the key as JSON text, quotes included
	node     *Node
	required bool
}

// keySet is a sorted list of key texts and the property each one names.
type keySet struct {
	keys  []string
	props []int
}

// maxDigits bounds the length of generated numbers (digits before and
// after the point and in the exponent, each).
const maxDigits = 15

// AnyObject returns the node for any JSON object (response_format
// json_object).
func AnyObject() *Node { return finish(&Node{kind: kObject, free: true}) }

// finish computes minSize for a node without references.
func finish(n *Node) *Node {
	if err := computeSizes([]*Node{n}); err != nil {
		panic(err) // only for the fixed nodes above
	}
	return n
}

// CompileSchema turns a JSON schema into a grammar node. Supported: type
// (a name or a list of names), properties (generated in the order given),
// required, additionalProperties (no extra properties are generated),
// items, minItems, maxItems, minLength, maxLength, enum, const, anyOf and
// oneOf whose branches start with different characters (e.g. a type and
// null), $ref to #, #/$defs/... or #/definitions/..., and annotations
// (title, description, default, examples, format, $schema, $id, strict).
// Anything else is refused, so that generated output always validates.
func CompileSchema(schema []byte) (*Node, error) {
	root, err := decodeSchema(schema)
	if err != nil {
		return nil, err
	}
	c := &compiler{root: root, refs: map[string]*Node{}}
	n, err := c.compile(root, "#")
	if err != nil {
		return nil, err
	}
	c.refs["#"] = n
	// Fill each $ref placeholder with its target; a target may itself be a
	// placeholder, so repeat until none is left.
	for pass := 0; len(c.pending) > 0; pass++ {
		if pass > len(c.all) {
			return nil, fmt.Errorf("schema: $ref cycle without a schema")
		}
		var left []*Node
		for _, r := range c.pending {
			target, ok := c.refs[r.ref]
			if !ok || target == nil {
				return nil, fmt.Errorf("schema: $ref %q not found (only #, #/$defs/... and #/definitions/... are supported)", r.ref)
			}
			if target.ref != "" {
				left = append(left, r)
				continue
			}
			*r = *target
		}
		if len(left) == len(c.pending) {
			return nil, fmt.Errorf("schema: $ref cycle without a schema")
		}
		c.pending = left
	}
	if err := computeSizes(c.all); err != nil {
		return nil, err
	}
	return n, nil
}

type compiler struct {
	root    any
	refs    map[string]*Node // compiled definitions by reference
	pending []*Node          // $ref placeholders to fill
	all     []*Node
}

func (c *compiler) node(n *Node) *Node {
	c.all = append(c.all, n)
	return n
}

// annotations are keywords that do not constrain output.
var annotations = map[string]bool{"title": true, "description": true, "default": true, "examples": true, "format": true,
	"$schema": true, "$id": true, "$comment": true, "strict": true, "$defs": true, "definitions": true, "readOnly": true, "writeOnly": true, "deprecated": true}

func (c *compiler) compile(v any, path string) (*Node, error) {
	switch t := v.(type) {
	case bool:
		if t {
			return c.node(&Node{kind: kAny}), nil
		}
		return nil, fmt.Errorf("schema %s: false accepts nothing", path)
	case *omap:
	default:
		return nil, fmt.Errorf("schema %s: want an object", path)
	}
	s := v.(*omap)
	if err := c.defs(s, path); err != nil {
		return nil, err
	}
	for _, k := range s.keys {
		switch k {
		case "type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems", "minLength", "maxLength",
			"enum", "const", "anyOf", "oneOf", "$ref":
		default:
			if !annotations[k] {
				return nil, fmt.Errorf("schema %s: keyword %q is not supported", path, k)
			}
		}
	}
	if ref, ok := s.vals["$ref"].(string); ok {
		if len(s.keys) > 1 && !onlyAnnotations(s, "$ref") {
			return nil, fmt.Errorf("schema %s: $ref with other keywords is not supported", path)
		}
		n := c.node(&Node{ref: ref})
		c.pending = append(c.pending, n)
		return n, nil
	}
	if e, ok := s.vals["const"]; ok {
		return c.literals(path, []any{e})
	}
	if e, ok := s.vals["enum"]; ok {
		list, ok := e.([]any)
		if !ok || len(list) == 0 {
			return nil, fmt.Errorf("schema %s: enum must be a non-empty array", path)
		}
		return c.literals(path, list)
	}
	for _, key := range []string{"anyOf", "oneOf"} {
		if a, ok := s.vals[key]; ok {
			list, ok := a.([]any)
			if !ok || len(list) == 0 {
				return nil, fmt.Errorf("schema %s: %s must be a non-empty array", path, key)
			}
			if len(list) > 100 {
				return nil, fmt.Errorf("schema %s: too many %s branches", path, key)
			}
			u := &Node{kind: kUnion}
			for i, sub := range list {
				n, err := c.compile(sub, fmt.Sprintf("%s/%s/%d", path, key, i))
				if err != nil {
					return nil, err
				}
				u.alts = append(u.alts, n)
			}
			return c.node(u), nil
		}
	}
	var types []string
	switch t := s.vals["type"].(type) {
	case nil:
		switch {
		case s.vals["properties"] != nil || s.vals["required"] != nil || s.vals["additionalProperties"] != nil:
			types = []string{"object"}
		case s.vals["items"] != nil || s.vals["minItems"] != nil || s.vals["maxItems"] != nil:
			types = []string{"array"}
		case s.vals["minLength"] != nil || s.vals["maxLength"] != nil:
			types = []string{"string"}
		default:
			return c.node(&Node{kind: kAny}), nil
		}
	case string:
		types = []string{t}
	case []any:
		for _, x := range t {
			name, ok := x.(string)
			if !ok {
				return nil, fmt.Errorf("schema %s: type list must hold names", path)
			}
			types = append(types, name)
		}
	default:
		return nil, fmt.Errorf("schema %s: type must be a name or a list", path)
	}
	var alts []*Node
	for _, typ := range types {
		n, err := c.typed(s, typ, path)
		if err != nil {
			return nil, err
		}
		alts = append(alts, n)
	}
	if len(alts) == 1 {
		return alts[0], nil
	}
	return c.node(&Node{kind: kUnion, alts: alts}), nil
}

func onlyAnnotations(s *omap, except string) bool {
	for _, k := range s.keys {
		if k != except && !annotations[k] {
			return false
		}
	}
	return true
}

// defs compiles $defs and definitions so $ref can find them.
func (c *compiler) defs(s *omap, path string) error {
	for _, key := range []string{"$defs", "definitions"} {
		d, ok := s.vals[key].(*omap)
		if !ok {
			continue
		}
		for _, name := range d.keys {
			ref := path + "/" + key + "/" + name
			if _, done := c.refs[ref]; done {
				continue
			}
			n, err := c.compile(d.vals[name], ref)
			if err != nil {
				return err
			}
			c.refs[ref] = n
		}
	}
	return nil
}

func (c *compiler) literals(path string, values []any) (*Node, error) {
	n := &Node{kind: kLiteral}
	for _, v := range values {
		var b strings.Builder
		if err := writeCompactJSON(&b, v); err != nil {
			return nil, fmt.Errorf("schema %s: %w", path, err)
		}
		n.literals = append(n.literals, b.String())
	}
	slices.Sort(n.literals)
	n.literals = slices.Compact(n.literals)
	return c.node(n), nil
}

func (c *compiler) typed(s *omap, typ, path string) (*Node, error) {
	switch typ {
	case "string":
		n := &Node{kind: kString, maxLen: -1}
		var err error
		if n.minLen, err = intKeyword(s, "minLength", 0); err != nil {
			return nil, err
		}
		if n.maxLen, err = intKeyword(s, "maxLength", -1); err != nil {
			return nil, err
		}
		if n.maxLen >= 0 && n.maxLen < n.minLen {
			return nil, fmt.Errorf("schema %s: maxLength < minLength", path)
		}
		return c.node(n), nil
	case "number":
		return c.node(&Node{kind: kNumber}), nil
	case "integer":
		return c.node(&Node{kind: kInteger}), nil
	case "boolean":
		return c.node(&Node{kind: kLiteral, literals: []string{"false", "true"}}), nil
	case "null":
		return c.node(&Node{kind: kLiteral, literals: []string{"null"}}), nil
	case "array":
		n := &Node{kind: kArray, maxItems: -1}
		var err error
		if items, ok := s.vals["items"]; ok {
			if n.items, err = c.compile(items, path+"/items"); err != nil {
				return nil, err
			}
		} else {
			n.items = c.node(&Node{kind: kAny})
		}
		if n.minItems, err = intKeyword(s, "minItems", 0); err != nil {
			return nil, err
		}
		if n.maxItems, err = intKeyword(s, "maxItems", -1); err != nil {
			return nil, err
		}
		if n.maxItems >= 0 && n.maxItems < n.minItems {
			return nil, fmt.Errorf("schema %s: maxItems < minItems", path)
		}
		return c.node(n), nil
	case "object":
		return c.object(s, path)
	}
	return nil, fmt.Errorf("schema %s: unknown type %q", path, typ)
}

func (c *compiler) object(s *omap, path string) (*Node, error) {
	n := &Node{kind: kObject, lastRequired: -1}
	props, _ := s.vals["properties"].(*omap)
	if s.vals["properties"] != nil && props == nil {
		return nil, fmt.Errorf("schema %s: properties must be an object", path)
	}
	closed := false
	if ap, ok := s.vals["additionalProperties"].(bool); ok && !ap {
		closed = true
	}
	if props == nil || len(props.keys) == 0 {
		if !closed && s.vals["required"] == nil {
			n.free = true
			return c.node(n), nil
		}
	}
	required := map[string]bool{}
	if r, ok := s.vals["required"]; ok {
		list, ok := r.([]any)
		if !ok {
			return nil, fmt.Errorf("schema %s: required must be an array", path)
		}
		for _, x := range list {
			name, ok := x.(string)
			if !ok {
				return nil, fmt.Errorf("schema %s: required must hold names", path)
			}
			if props == nil || props.vals[name] == nil {
				return nil, fmt.Errorf("schema %s: required property %q is not declared in properties", path, name)
			}
			required[name] = true
		}
	}
	if props != nil {
		for _, name := range props.keys {
			sub, err := c.compile(props.vals[name], path+"/properties/"+name)
			if err != nil {
				return nil, err
			}
			var key strings.Builder
			writePyString(&key, name)
			if !required[name] && len(props.keys) > 64 {
				return nil, fmt.Errorf("schema %s: more than 64 properties with optional ones is not supported", path)
			}
			n.props = append(n.props, prop{name: name, key: key.String(), node: sub, required: required[name]})
		}
	}
	for i, p := range n.props {
		if p.required {
			n.lastRequired = i
		}
	}
	// The keys allowed next, when props[:i] are behind: the optional ones up
	// to and including the next required one.
	n.keySets = make([]keySet, len(n.props)+1)
	for i := range n.props {
		var ks keySet
		for j := i; j < len(n.props); j++ {
			ks.keys = append(ks.keys, n.props[j].key)
			ks.props = append(ks.props, j)
			if n.props[j].required {
				break
			}
		}
		sortKeySet(&ks)
		n.keySets[i] = ks
	}
	return c.node(n), nil
}

func sortKeySet(ks *keySet) {
	idx := make([]int, len(ks.keys))
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(a, b int) int { return strings.Compare(ks.keys[a], ks.keys[b]) })
	keys := make([]string, len(idx))
	props := make([]int, len(idx))
	for i, j := range idx {
		keys[i], props[i] = ks.keys[j], ks.props[j]
	}
	ks.keys, ks.props = keys, props
}

func intKeyword(s *omap, key string, def int) (int, error) {
	v, ok := s.vals[key]
	if !ok {
		return def, nil
	}
	num, ok := v.(json.Number)
	if !ok {
		return 0, fmt.Errorf("schema: %s must be a number", key)
	}
	i, err := num.Int64()
	if err != nil || i < 0 || i > 1<<20 {
		return 0, fmt.Errorf("schema: %s %s is not a usable count", key, num)
	}
	return int(i), nil
}

// firstBytes is the set of bytes a node's text can start with.
func firstBytes(n *Node, seen map[*Node]bool) [256]bool {
	var set [256]bool
	if seen[n] {
		return set
	}
	seen[n] = true
	add := func(s string) {
		for i := 0; i < len(s); i++ {
			set[s[i]] = true
		}
	}
	switch n.kind {
	case kAny:
		add(`{["-0123456789tfn`)
	case kObject:
		add("{")
	case kArray:
		add("[")
	case kString:
		add(`"`)
	case kNumber, kInteger:
		add("-0123456789")
	case kLiteral:
		for _, l := range n.literals {
			set[l[0]] = true
		}
	case kUnion:
		for _, a := range n.alts {
			sub := firstBytes(a, seen)
			for b, ok := range sub {
				set[b] = set[b] || ok
			}
		}
	}
	return set
}

// computeSizes sets minSize on every node by fixed-point iteration (refs
// may be cyclic), checks unions are decidable by their first byte and
// precomputes the required-property sums of objects.
func computeSizes(nodes []*Node) error {
	const inf = 1 << 30
	for _, n := range nodes {
		n.minSize = inf
	}
	for changed, round := true, 0; changed; round++ {
		if round > 10000 {
			return fmt.Errorf("schema: too deep")
		}
		changed = false
		for _, n := range nodes {
			if s := sizeOf(n, inf); s < n.minSize {
				n.minSize, changed = s, true
			}
		}
	}
	for _, n := range nodes {
		if n.minSize >= inf {
			return fmt.Errorf("schema: no finite JSON value satisfies it (a required property refers back to itself)")
		}
		if n.kind == kUnion {
			for b := range n.unionIndex {
				n.unionIndex[b] = -1
			}
			for i, a := range n.alts {
				fb := firstBytes(a, map[*Node]bool{})
				for b, ok := range fb {
					if !ok {
						continue
					}
					if n.unionIndex[b] >= 0 {
						return fmt.Errorf("schema: anyOf/oneOf branches (or types) that can start with the same character %q are not supported", rune(b))
					}
					n.unionIndex[b] = int8(i)
				}
			}
		}
		if n.kind == kObject && !n.free {
			k := len(n.props)
			n.reqSum = make([]int, k+1)
			n.reqCount = make([]int, k+1)
			for i := k - 1; i >= 0; i-- {
				n.reqSum[i], n.reqCount[i] = n.reqSum[i+1], n.reqCount[i+1]
				if p := n.props[i]; p.required {
					n.reqSum[i] += 1 + len(p.key) + 1 + p.node.minSize // ,"k":v
					n.reqCount[i]++
				}
			}
		}
	}
	return nil
}

func sizeOf(n *Node, inf int) int {
	switch n.kind {
	case kAny, kNumber, kInteger:
		return 1
	case kString:
		return 2 + n.minLen
	case kLiteral:
		m := inf
		for _, l := range n.literals {
			m = min(m, len(l))
		}
		return m
	case kUnion:
		m := inf
		for _, a := range n.alts {
			m = min(m, a.minSize)
		}
		return m
	case kArray:
		if n.minItems == 0 {
			return 2
		}
		if n.items.minSize >= inf {
			return inf
		}
		return 2 + n.minItems*n.items.minSize + n.minItems - 1
	case kObject:
		if n.free {
			return 2
		}
		total, count := 0, 0
		for _, p := range n.props {
			if p.required {
				if p.node.minSize >= inf {
					return inf
				}
				total += len(p.key) + 1 + p.node.minSize
				count++
			}
		}
		return 2 + total + max(0, count-1)
	}
	return inf
}

// omap is a decoded JSON object with its key order.
type omap struct {
	keys []string
	vals map[string]any
}

// decodeSchema decodes JSON with objects as *omap and numbers as json.Number.
func decodeSchema(data []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	v, err := decodeOMap(dec)
	if err != nil {
		return nil, fmt.Errorf("schema: %w", err)
	}
	if _, err := dec.Token(); err == nil {
		return nil, fmt.Errorf("schema: trailing data")
	}
	return v, nil
}

func decodeOMap(dec *json.Decoder) (any, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	d, ok := tok.(json.Delim)
	if !ok {
		return tok, nil
	}
	switch d {
	case '{':
		m := &omap{vals: map[string]any{}}
		for dec.More() {
			k, err := dec.Token()
			if err != nil {
				return nil, err
			}
			v, err := decodeOMap(dec)
			if err != nil {
				return nil, err
			}
			key := k.(string)
			if _, dup := m.vals[key]; !dup {
				m.keys = append(m.keys, key)
			}
			m.vals[key] = v
		}
		_, err := dec.Token()
		return m, err
	case '[':
		list := []any{}
		for dec.More() {
			v, err := decodeOMap(dec)
			if err != nil {
				return nil, err
			}
			list = append(list, v)
		}
		_, err := dec.Token()
		return list, err
	}
	return nil, fmt.Errorf("unexpected %v", d)
}

// writeCompactJSON writes a decoded schema value as compact JSON.
func writeCompactJSON(b *strings.Builder, v any) error {
	switch t := v.(type) {
	case nil:
		b.WriteString("null")
	case bool:
		fmt.Fprint(b, t)
	case json.Number:
		b.WriteString(string(t))
	case string:
		writePyString(b, t)
	case []any:
		b.WriteByte('[')
		for i, x := range t {
			if i > 0 {
				b.WriteByte(',')
			}
			if err := writeCompactJSON(b, x); err != nil {
				return err
			}
		}
		b.WriteByte(']')
	case *omap:
		b.WriteByte('{')
		for i, k := range t.keys {
			if i > 0 {
				b.WriteByte(',')
			}
			writePyString(b, k)
			b.WriteByte(':')
			if err := writeCompactJSON(b, t.vals[k]); err != nil {
				return err
			}
		}
		b.WriteByte('}')
	default:
		return fmt.Errorf("cannot write %T", v)
	}
	return nil
}
