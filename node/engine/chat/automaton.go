package chat

// The automaton reads JSON one byte at a time and rejects the first byte
// that cannot lead to a value the grammar accepts. Its State is a
// persistent stack: Step returns a new State and leaves the old one usable,
// so the token masker can try every token from the same state, sharing
// the frames below the top (only opening an object, array or string
// allocates).

// frameKind is what a stack frame is reading.
type frameKind uint8

const (
	fRoot     frameKind = iota // bottom: st 0 value pending, 1 done
	fValue                     // before a value of node (whitespace allowed)
	fObject                    // inside an object
	fArray                     // inside an array
	fString                    // inside a string
	fNumber                    // inside a number
	fLiteral                   // matching one of lits (enum, true/false/null)
	fKey                       // matching a declared property key
	fTools                     // the <tool_call> wrapper
	fToolName                  // matching a function name
)

// Object states.
const (
	oStart   = iota // after '{'
	oKey            // a key is being read (free objects: a string frame above)
	oColon          // after the key
	oWait           // a value is being read
	oAfter          // after a value
	oNeedKey        // after ','
)

// Array states.
const (
	aStart = iota // after '['
	aWait         // an item is being read
	aAfter        // after an item
	aNeed         // after ','
)

// Tool-call states.
const (
	tOpen  = iota // matching the opening text
	tName         // the name literal is being read
	tMid          // matching ", "arguments": "
	tArgs         // the arguments are being read
	tClose        // matching the closing text
	tDone         // after a call
)

// maxWhitespace bounds consecutive insignificant whitespace, so a weak
// model cannot spend its whole budget on indentation.
const maxWhitespace = 16

const inf = 1 << 30

type frame struct {
	kind   frameKind
	st     uint8
	ws     uint8
	node   *Node    // nil: any value / free object / array of anything
	lits   []string // fLiteral, fKey, fToolName: sorted candidates
	n      int32    // object: next property; array: items; string: chars; literal: position; tools: position
	lo, hi int32    // literal candidate range; number: fraction / exponent digits; tools: chosen function (lo)
	aux    int32    // string: continuation bytes left; object: chosen property; key: key-set index; tools: calls made
}

type stackNode struct {
	f    frame
	next *stackNode
}

// State is a position in the grammar. The zero State is not valid; use
// NewState or NewToolState.
type State struct {
	top   frame
	below *stackNode
	tools *toolSpec // for the tool wrapper frames
}

// NewState starts reading one JSON value of node (nil: any value).
func NewState(node *Node) State {
	return State{top: frame{kind: fValue, node: node}, below: &stackNode{f: frame{kind: fRoot}}}
}

func (s *State) push(f frame) {
	s.below = &stackNode{f: s.top, next: s.below}
	s.top = f
}

// pop removes the top frame and tells the parent its child finished with
// result (the chosen property or function, else unused).
func (s *State) pop(result int32) {
	s.top = s.below.f
	s.below = s.below.next
	p := &s.top
	switch p.kind {
	case fRoot:
		p.st = 1
	case fObject:
		switch p.st {
		case oKey:
			if p.node != nil && !p.node.free {
				p.aux = result
				p.n = result + 1
			}
			p.st = oColon
		case oWait:
			p.st = oAfter
		}
	case fArray:
		p.st = aAfter
	case fTools:
		switch p.st {
		case tName:
			p.st, p.lo, p.n = tMid, result, 0
		case tArgs:
			p.st, p.n = tClose, 0
		}
	}
	p.ws = 0
}

// Step feeds one byte and returns the next state, or false when the byte
// cannot be part of an accepted text.
func (s State) Step(c byte) (State, bool) {
	for range 64 { // a byte can close several numbers/literals at most once each
		switch s.step(c) {
		case consumed:
			return s, true
		case rejected:
			return s, false
		}
	}
	return s, false
}

// StepBytes feeds b byte by byte.
func (s State) StepBytes(b []byte) (State, bool) {
	ok := true
	for _, c := range b {
		if s, ok = s.Step(c); !ok {
			return s, false
		}
	}
	return s, true
}

type outcome uint8

const (
	consumed outcome = iota
	rejected
	refeed // the top frame ended before c; feed c to the parent
)

func isWS(c byte) bool { return c == ' ' || c == '\n' || c == '\t' || c == '\r' }

// ws counts a whitespace byte against the limit.
func (f *frame) space() outcome {
	if f.ws >= maxWhitespace {
		return rejected
	}
	f.ws++
	return consumed
}

func (s *State) step(c byte) outcome {
	f := &s.top
	switch f.kind {
	case fRoot:
		return rejected
	case fValue:
		if isWS(c) {
			return f.space()
		}
		return s.startValue(f.node, c)
	case fObject:
		return s.stepObject(c)
	case fArray:
		return s.stepArray(c)
	case fString:
		return s.stepString(c)
	case fNumber:
		return s.stepNumber(c)
	case fLiteral, fKey, fToolName:
		return s.stepLiteral(c)
	case fTools:
		return s.stepTools(c)
	}
	return rejected
}

// startValue replaces the fValue on top with the frame for the value that
// c starts.
func (s *State) startValue(n *Node, c byte) outcome {
	f := &s.top
	kind := kAny
	if n != nil {
		kind = n.kind
	}
	switch kind {
	case kUnion:
		i := n.unionIndex[c]
		if i < 0 {
			return rejected
		}
		return s.startValue(n.alts[i], c)
	case kLiteral:
		*f = frame{kind: fLiteral, node: n, lits: n.literals, hi: int32(len(n.literals))}
		return refeed
	case kObject:
		if c != '{' {
			return rejected
		}
		*f = frame{kind: fObject, node: n, st: oStart}
		return consumed
	case kArray:
		if c != '[' {
			return rejected
		}
		*f = frame{kind: fArray, node: n, st: aStart}
		return consumed
	case kString:
		if c != '"' {
			return rejected
		}
		*f = frame{kind: fString, node: n}
		return consumed
	case kNumber, kInteger:
		if c != '-' && (c < '0' || c > '9') {
			return rejected
		}
		*f = frame{kind: fNumber, node: n}
		return refeed
	}
	// Any value.
	switch {
	case c == '{':
		*f = frame{kind: fObject, st: oStart}
	case c == '[':
		*f = frame{kind: fArray, st: aStart}
	case c == '"':
		*f = frame{kind: fString}
	case c == '-' || c >= '0' && c <= '9':
		*f = frame{kind: fNumber}
		return refeed
	case c == 't' || c == 'f' || c == 'n':
		lits := []string{"false", "null", "true"}
		*f = frame{kind: fLiteral, lits: lits, hi: int32(len(lits))}
		return refeed
	default:
		return rejected
	}
	return consumed
}

func (s *State) stepObject(c byte) outcome {
	f := &s.top
	free := f.node == nil || f.node.free
	switch f.st {
	case oStart, oNeedKey:
		if isWS(c) {
			return f.space()
		}
		if c == '}' && f.st == oStart {
			if !free && f.n <= int32(f.node.lastRequired) {
				return rejected
			}
			s.pop(0)
			return consumed
		}
		if c != '"' {
			return rejected
		}
		f.st = oKey
		if free {
			s.push(frame{kind: fString})
			return consumed
		}
		ks := f.node.keySets[f.n]
		if len(ks.keys) == 0 {
			return rejected
		}
		s.push(frame{kind: fKey, lits: ks.keys, hi: int32(len(ks.keys)), aux: f.n})
		return refeed
	case oColon:
		if isWS(c) {
			return f.space()
		}
		if c != ':' {
			return rejected
		}
		f.st, f.ws = oWait, 0
		var child *Node
		if !free {
			child = f.node.props[f.aux].node
		}
		s.push(frame{kind: fValue, node: child})
		return consumed
	case oAfter:
		if isWS(c) {
			return f.space()
		}
		switch c {
		case ',':
			if !free && int(f.n) >= len(f.node.props) {
				return rejected
			}
			f.st, f.ws = oNeedKey, 0
			return consumed
		case '}':
			if !free && f.n <= int32(f.node.lastRequired) {
				return rejected
			}
			s.pop(0)
			return consumed
		}
	}
	return rejected
}

func (s *State) stepArray(c byte) outcome {
	f := &s.top
	var items *Node
	minItems, maxItems := 0, -1
	if f.node != nil {
		items, minItems, maxItems = f.node.items, f.node.minItems, f.node.maxItems
	}
	switch f.st {
	case aStart, aNeed:
		if isWS(c) {
			return f.space()
		}
		if c == ']' && f.st == aStart {
			if minItems > 0 {
				return rejected
			}
			s.pop(0)
			return consumed
		}
		if f.st == aStart && maxItems == 0 {
			return rejected
		}
		f.st, f.ws = aWait, 0
		f.n++
		s.push(frame{kind: fValue, node: items})
		return refeed
	case aAfter:
		if isWS(c) {
			return f.space()
		}
		switch c {
		case ',':
			if maxItems >= 0 && int(f.n) >= maxItems {
				return rejected
			}
			f.st, f.ws = aNeed, 0
			return consumed
		case ']':
			if int(f.n) < minItems {
				return rejected
			}
			s.pop(0)
			return consumed
		}
	}
	return rejected
}

func isHex(c byte) bool { return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F' }

func (s *State) stepString(c byte) outcome {
	f := &s.top
	minLen, maxLen := 0, -1
	if f.node != nil && f.node.kind == kString {
		minLen, maxLen = f.node.minLen, f.node.maxLen
	}
	room := func() bool { return maxLen < 0 || int(f.n) < maxLen }
	if f.aux > 0 { // inside a multi-byte character
		if c < 0x80 || c > 0xBF {
			return rejected
		}
		f.aux--
		return consumed
	}
	switch {
	case f.st == 0:
		switch {
		case c == '"':
			if int(f.n) < minLen {
				return rejected
			}
			s.pop(0)
			return consumed
		case c == '\\':
			if !room() {
				return rejected
			}
			f.n++
			f.st = 1
		case c < 0x20:
			return rejected
		case c < 0x80:
			if !room() {
				return rejected
			}
			f.n++
		case c >= 0xC2 && c <= 0xF4:
			if !room() {
				return rejected
			}
			f.n++
			f.aux = 1
			if c >= 0xE0 {
				f.aux = 2
			}
			if c >= 0xF0 {
				f.aux = 3
			}
		default:
			return rejected
		}
	case f.st == 1:
		switch c {
		case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			f.st = 0
		case 'u':
			f.st = 2
		default:
			return rejected
		}
	default: // \uXXXX digits; surrogates (\uD800-\uDFFF) are refused
		if !isHex(c) {
			return rejected
		}
		if f.st == 2 {
			f.lo = int32(c | 0x20)
		}
		if f.st == 3 && f.lo == 'd' && (c >= '8' && c <= '9' || c|0x20 >= 'a' && c|0x20 <= 'f') {
			return rejected
		}
		f.st++
		if f.st == 6 {
			f.st = 0
		}
	}
	return consumed
}

// Number states: 0 start, 1 after '-', 2 leading zero, 3 integer digits,
// 4 after '.', 5 fraction digits, 6 after 'e', 7 after the exponent sign,
// 8 exponent digits. 2, 3, 5 and 8 accept.
func numberAccepts(st uint8) bool { return st == 2 || st == 3 || st == 5 || st == 8 }

func (s *State) stepNumber(c byte) outcome {
	f := &s.top
	integer := f.node != nil && f.node.kind == kInteger
	digit := c >= '0' && c <= '9'
	switch f.st {
	case 0:
		switch {
		case c == '-':
			f.st = 1
			return consumed
		case c == '0':
			f.st, f.n = 2, 1
			return consumed
		case digit:
			f.st, f.n = 3, 1
			return consumed
		}
		return rejected
	case 1:
		switch {
		case c == '0':
			f.st, f.n = 2, 1
			return consumed
		case digit:
			f.st, f.n = 3, 1
			return consumed
		}
		return rejected
	case 2, 3:
		switch {
		case digit && f.st == 3 && f.n < maxDigits:
			f.n++
			return consumed
		case c == '.' && !integer:
			f.st = 4
			return consumed
		case (c == 'e' || c == 'E') && !integer:
			f.st = 6
			return consumed
		}
	case 4:
		if digit {
			f.st, f.lo = 5, 1
			return consumed
		}
		return rejected
	case 5:
		switch {
		case digit && f.lo < maxDigits:
			f.lo++
			return consumed
		case c == 'e' || c == 'E':
			f.st = 6
			return consumed
		}
	case 6:
		switch {
		case c == '+' || c == '-':
			f.st = 7
			return consumed
		case digit:
			f.st, f.hi = 8, 1
			return consumed
		}
		return rejected
	case 7:
		if digit {
			f.st, f.hi = 8, 1
			return consumed
		}
		return rejected
	case 8:
		if digit && f.hi < 3 {
			f.hi++
			return consumed
		}
	}
	if !numberAccepts(f.st) || digit {
		return rejected
	}
	s.pop(0)
	return refeed
}

// stepLiteral narrows the candidates to those with c next.
func (s *State) stepLiteral(c byte) outcome {
	f := &s.top
	pos := int(f.n)
	lo, hi := int(f.lo), int(f.hi)
	nlo, nhi := -1, -1
	complete := -1
	for i := lo; i < hi; i++ {
		l := f.lits[i]
		if len(l) == pos {
			complete = i
			continue
		}
		if l[pos] == c {
			if nlo < 0 {
				nlo = i
			}
			nhi = i + 1
		}
	}
	if nlo < 0 {
		if complete >= 0 && f.kind == fLiteral { // a number literal ended before c
			s.pop(0)
			return refeed
		}
		return rejected
	}
	f.lo, f.hi, f.n = int32(nlo), int32(nhi), int32(pos+1)
	if nhi-nlo == 1 && len(f.lits[nlo]) == pos+1 && !numberLiteral(f.lits[nlo]) {
		// Complete and nothing can follow inside it.
		result := int32(nlo)
		if f.kind == fKey {
			result = int32(s.below.f.node.keySets[f.aux].props[nlo])
		}
		s.pop(result)
	}
	return consumed
}

// numberLiteral reports whether a literal is a number, which another byte
// may still extend (1 vs 10).
func numberLiteral(l string) bool { return l[0] == '-' || l[0] >= '0' && l[0] <= '9' }

// Done reports that the text is complete and nothing more may follow.
func (s State) Done() bool {
	switch s.top.kind {
	case fRoot:
		return s.top.st == 1
	case fTools:
		return s.top.st == tDone && !s.tools.parallel
	}
	return false
}

// Accepting reports that the text read so far is a complete value (the
// model may end here).
func (s State) Accepting() bool { return s.MinClose() == 0 }

// MinClose is the fewest bytes that complete the text from this state.
func (s State) MinClose() int {
	total := 0
	f := s.top
	below := s.below
	for {
		switch f.kind {
		case fKey: // jointly with the object it names a property of
			parent := below.f.node
			below = below.next
			ks := parent.keySets[f.aux]
			best := inf
			for i := f.lo; i < f.hi; i++ {
				p := ks.props[i]
				best = min(best, len(f.lits[i])-int(f.n)+1+parent.props[p].node.minSize+parent.reqSum[p+1]+1)
			}
			total += best
		case fToolName: // jointly with the call it names
			t := s.tools
			below = below.next
			best := inf
			for i := f.lo; i < f.hi; i++ {
				best = min(best, len(f.lits[i])-int(f.n)+len(toolMid)+t.args[i].minSize+len(toolClose))
			}
			total += best
		default:
			total += f.cost(s.tools)
		}
		if below == nil {
			return total
		}
		f, below = below.f, below.next
	}
}

// cost is the fewest bytes that finish this frame once its child (if any)
// has finished.
func (f *frame) cost(t *toolSpec) int {
	switch f.kind {
	case fValue:
		if f.node == nil {
			return 1
		}
		return f.node.minSize
	case fString:
		c := int(f.aux) + 1
		switch {
		case f.st == 1:
			c++
		case f.st >= 2:
			c += 6 - int(f.st)
		}
		if f.node != nil && f.node.kind == kString {
			c += max(0, f.node.minLen-int(f.n))
		}
		return c
	case fNumber:
		if numberAccepts(f.st) {
			return 0
		}
		return 1
	case fLiteral:
		best := inf
		for i := f.lo; i < f.hi; i++ {
			best = min(best, len(f.lits[i])-int(f.n))
		}
		return best
	case fObject:
		if f.node == nil || f.node.free {
			switch f.st {
			case oStart, oWait, oAfter:
				return 1
			case oKey, oColon:
				return 3 // :0}
			}
			return 5 // "":0}
		}
		n := f.node
		switch f.st {
		case oStart:
			return n.reqSum[0] - min(1, n.reqCount[0]) + 1
		case oColon:
			return 1 + n.props[f.aux].node.minSize + n.reqSum[f.n] + 1
		case oWait, oAfter:
			return n.reqSum[f.n] + 1
		case oNeedKey:
			best := inf
			for _, p := range n.keySets[f.n].props {
				best = min(best, len(n.props[p].key)+1+n.props[p].node.minSize+n.reqSum[p+1]+1)
			}
			return best
		}
	case fArray:
		ms, minItems := 1, 0
		if f.node != nil {
			ms, minItems = f.node.items.minSize, f.node.minItems
		}
		switch f.st {
		case aStart:
			if minItems == 0 {
				return 1
			}
			return minItems*ms + minItems - 1 + 1
		case aWait, aAfter:
			return max(0, minItems-int(f.n))*(ms+1) + 1
		case aNeed:
			k := max(1, minItems-int(f.n))
			return k*ms + k - 1 + 1
		}
	case fTools:
		switch f.st {
		case tOpen:
			return len(t.open(f.aux)) - int(f.n) + t.minCall
		case tMid:
			return len(toolMid) - int(f.n) + t.args[f.lo].minSize + len(toolClose)
		case tArgs:
			return len(toolClose)
		case tClose:
			return len(toolClose) - int(f.n)
		}
	}
	return 0
}
