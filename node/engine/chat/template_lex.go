package chat

import (
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// The lexer follows jinja2's with the options Hugging Face renders chat
// templates with: trim_blocks (a newline right after a block or comment tag
// is dropped), lstrip_blocks (whitespace from the start of a line up to a
// block or comment tag is dropped), "-" and "+" whitespace control, and
// keep_trailing_newline off.

type tokKind int

const (
	tkText tokKind = iota
	tkVarBegin
	tkVarEnd
	tkBlockBegin
	tkBlockEnd
	tkName
	tkString
	tkInt
	tkFloat
	tkOp
	tkEOF
)

type token struct {
	kind tokKind
	val  string // text, name, operator, or the decoded string literal
	num  any    // int64 or float64 for numbers
	line int
}

// lexError is a syntax error with its line.
type lexError struct {
	line int
	msg  string
}

func (e *lexError) Error() string { return fmt.Sprintf("line %d: %s", e.line, e.msg) }

type lexer struct {
	src          string
	pos, line    int
	lineStarting bool
	toks         []token
}

// lexTemplate splits a template source into tokens.
func lexTemplate(src string) ([]token, error) {
	src = strings.ReplaceAll(src, "\r\n", "\n")
	src = strings.ReplaceAll(src, "\r", "\n")
	src = strings.TrimSuffix(src, "\n")
	lx := &lexer{src: src, line: 1, lineStarting: true}
	if err := lx.run(); err != nil {
		return nil, err
	}
	lx.toks = append(lx.toks, token{kind: tkEOF, line: lx.line})
	return lx.toks, nil
}

func (lx *lexer) emitText(s string) {
	if s != "" {
		lx.toks = append(lx.toks, token{kind: tkText, val: s, line: lx.line})
	}
	lx.line += strings.Count(s, "\n")
}

// nextTag finds the next "{{", "{%" or "{#" at or after pos.
func (lx *lexer) nextTag() int {
	for i := lx.pos; i+1 < len(lx.src); i++ {
		if lx.src[i] == '{' {
			switch lx.src[i+1] {
			case '{', '%', '#':
				return i
			}
		}
	}
	return -1
}

func (lx *lexer) run() error {
	for lx.pos < len(lx.src) {
		at := lx.nextTag()
		if at < 0 {
			lx.emitText(lx.src[lx.pos:])
			lx.pos = len(lx.src)
			return nil
		}
		text := lx.src[lx.pos:at]
		kind := lx.src[at+1]
		sign := byte(0)
		if at+2 < len(lx.src) && (lx.src[at+2] == '-' || lx.src[at+2] == '+') {
			sign = lx.src[at+2]
		}
		switch {
		case sign == '-':
			stripped := strings.TrimRightFunc(text, pyIsSpace)
			lx.line += strings.Count(text[len(stripped):], "\n")
			text = stripped
		case sign != '+' && kind != '{':
			lpos := strings.LastIndexByte(text, '\n') + 1
			if (lpos > 0 || lx.lineStarting) && lpos < len(text) && strings.TrimLeftFunc(text[lpos:], pyIsSpace) == "" {
				text = text[:lpos]
			}
		}
		lx.emitText(text)
		lx.pos = at + 2
		if sign != 0 {
			lx.pos++
		}
		var err error
		switch kind {
		case '#':
			err = lx.comment()
		case '%':
			if lx.rawBlock() {
				continue
			}
			lx.toks = append(lx.toks, token{kind: tkBlockBegin, line: lx.line})
			err = lx.inside("%}", tkBlockEnd, true)
		default:
			lx.toks = append(lx.toks, token{kind: tkVarBegin, line: lx.line})
			err = lx.inside("}}", tkVarEnd, false)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// closeTag consumes what follows a tag's end: all whitespace after "-",
// nothing after "+", else one newline with trim.
func (lx *lexer) closeTag(sign byte, trim bool) {
	start := lx.pos
	switch {
	case sign == '-':
		rest := strings.TrimLeftFunc(lx.src[lx.pos:], pyIsSpace)
		lx.pos = len(lx.src) - len(rest)
	case sign == '+':
	case trim && strings.HasPrefix(lx.src[lx.pos:], "\n"):
		lx.pos++
	}
	lx.line += strings.Count(lx.src[start:lx.pos], "\n")
	if lx.pos > start {
		lx.lineStarting = lx.src[lx.pos-1] == '\n'
	}
}

func (lx *lexer) comment() error {
	end := strings.Index(lx.src[lx.pos:], "#}")
	if end < 0 {
		return &lexError{lx.line, "missing end of comment tag"}
	}
	body := lx.src[lx.pos : lx.pos+end]
	lx.line += strings.Count(body, "\n")
	sign := byte(0)
	if strings.HasSuffix(body, "-") || strings.HasSuffix(body, "+") {
		sign = body[len(body)-1]
	}
	lx.pos += end + 2
	lx.lineStarting = false
	lx.closeTag(sign, true)
	return nil
}

// rawBlock handles {% raw %}...{% endraw %} when the tag at pos is one.
func (lx *lexer) rawBlock() bool {
	rest := lx.src[lx.pos:]
	trimmed := strings.TrimLeftFunc(rest, pyIsSpace)
	if !strings.HasPrefix(trimmed, "raw") {
		return false
	}
	after := strings.TrimLeftFunc(trimmed[3:], pyIsSpace)
	var sign byte
	switch {
	case strings.HasPrefix(after, "-%}"):
		sign = '-'
		after = after[3:]
	case strings.HasPrefix(after, "%}"):
		after = after[2:]
	default:
		return false
	}
	lx.pos = len(lx.src) - len(after)
	if sign == '-' {
		lx.closeTag('-', false)
	}
	for i := lx.pos; i+1 < len(lx.src); i++ {
		if lx.src[i] != '{' || lx.src[i+1] != '%' {
			continue
		}
		j := i + 2
		esign := byte(0)
		if j < len(lx.src) && (lx.src[j] == '-' || lx.src[j] == '+') {
			esign = lx.src[j]
			j++
		}
		tail := strings.TrimLeftFunc(lx.src[j:], pyIsSpace)
		if !strings.HasPrefix(tail, "endraw") {
			continue
		}
		tail = strings.TrimLeftFunc(tail[6:], pyIsSpace)
		csign := byte(0)
		switch {
		case strings.HasPrefix(tail, "-%}"), strings.HasPrefix(tail, "+%}"):
			csign = tail[0]
			tail = tail[3:]
		case strings.HasPrefix(tail, "%}"):
			tail = tail[2:]
		default:
			continue
		}
		text := lx.src[lx.pos:i]
		if esign == '-' {
			text = strings.TrimRightFunc(text, pyIsSpace)
		}
		lx.emitText(text)
		lx.pos = len(lx.src) - len(tail)
		lx.closeTag(csign, true)
		return true
	}
	return false
}

// inside tokenizes an expression up to its closing delimiter.
func (lx *lexer) inside(closer string, endKind tokKind, trim bool) error {
	var stack []byte
	for {
		if lx.pos >= len(lx.src) {
			return &lexError{lx.line, "unexpected end of template, expected '" + closer + "'"}
		}
		rest := lx.src[lx.pos:]
		if len(stack) == 0 {
			sign := byte(0)
			if (rest[0] == '-' || rest[0] == '+') && strings.HasPrefix(rest[1:], closer) && !(rest[0] == '+' && closer == "}}") {
				sign = rest[0]
			}
			if sign != 0 || strings.HasPrefix(rest, closer) {
				lx.pos += len(closer)
				if sign != 0 {
					lx.pos++
				}
				lx.toks = append(lx.toks, token{kind: endKind, line: lx.line})
				lx.lineStarting = false
				lx.closeTag(sign, trim)
				return nil
			}
		}
		r, size := utf8.DecodeRuneInString(rest)
		switch {
		case pyIsSpace(r):
			if r == '\n' {
				lx.line++
			}
			lx.pos += size
			lx.lineStarting = r == '\n'
			continue
		case r == '_' || unicode.IsLetter(r):
			end := lx.pos
			for end < len(lx.src) {
				c, n := utf8.DecodeRuneInString(lx.src[end:])
				if c != '_' && !unicode.IsLetter(c) && !unicode.IsDigit(c) {
					break
				}
				end += n
			}
			lx.toks = append(lx.toks, token{kind: tkName, val: lx.src[lx.pos:end], line: lx.line})
			lx.pos = end
		case r >= '0' && r <= '9':
			if err := lx.number(); err != nil {
				return err
			}
		case r == '\'' || r == '"':
			if err := lx.str(byte(r)); err != nil {
				return err
			}
		default:
			op := ""
			for _, o := range []string{"//", "**", "==", "!=", ">=", "<="} {
				if strings.HasPrefix(rest, o) {
					op = o
					break
				}
			}
			if op == "" {
				if !strings.ContainsRune("+-/*%~[](){}|.,:;=<>", r) {
					return &lexError{lx.line, fmt.Sprintf("unexpected char %q", r)}
				}
				op = string(r)
			}
			switch op {
			case "(", "[", "{":
				stack = append(stack, map[string]byte{"(": ')', "[": ']', "{": '}'}[op])
			case ")", "]", "}":
				if len(stack) == 0 || stack[len(stack)-1] != op[0] {
					return &lexError{lx.line, "unexpected '" + op + "'"}
				}
				stack = stack[:len(stack)-1]
			}
			lx.toks = append(lx.toks, token{kind: tkOp, val: op, line: lx.line})
			lx.pos += len(op)
		}
		lx.lineStarting = false
	}
}

// number lexes an integer or float literal (underscores allowed).
func (lx *lexer) number() error {
	s := lx.src[lx.pos:]
	digits := func(i int) int {
		for i < len(s) && (s[i] >= '0' && s[i] <= '9' || s[i] == '_' && i+1 < len(s) && s[i+1] >= '0' && s[i+1] <= '9') {
			i++
		}
		return i
	}
	end := digits(0)
	isFloat := false
	if end+1 < len(s) && s[end] == '.' && s[end+1] >= '0' && s[end+1] <= '9' {
		end = digits(end + 1)
		isFloat = true
	}
	if end < len(s) && (s[end] == 'e' || s[end] == 'E') {
		j := end + 1
		if j < len(s) && (s[j] == '+' || s[j] == '-') {
			j++
		}
		if j < len(s) && s[j] >= '0' && s[j] <= '9' {
			end = digits(j)
			isFloat = true
		}
	}
	text := strings.ReplaceAll(s[:end], "_", "")
	tok := token{kind: tkInt, val: text, line: lx.line}
	if isFloat {
		f, err := strconv.ParseFloat(text, 64)
		if err != nil {
			return &lexError{lx.line, "bad number " + text}
		}
		tok.kind, tok.num = tkFloat, f
	} else {
		n, err := strconv.ParseInt(text, 10, 64)
		if err != nil {
			return &lexError{lx.line, "integer out of range " + text}
		}
		tok.num = n
	}
	lx.toks = append(lx.toks, tok)
	lx.pos += end
	return nil
}

// str lexes a quoted string and decodes Python's escapes.
func (lx *lexer) str(q byte) error {
	i := lx.pos + 1
	for i < len(lx.src) && lx.src[i] != q {
		if lx.src[i] == '\\' {
			i++
		}
		i++
	}
	if i >= len(lx.src) {
		return &lexError{lx.line, "unterminated string"}
	}
	raw := lx.src[lx.pos+1 : i]
	lx.toks = append(lx.toks, token{kind: tkString, val: unescapePy(raw), line: lx.line})
	lx.line += strings.Count(raw, "\n")
	lx.pos = i + 1
	return nil
}

// unescapePy decodes backslash escapes as Python's unicode-escape codec.
func unescapePy(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '\\' || i+1 >= len(s) {
			b.WriteByte(c)
			continue
		}
		i++
		switch e := s[i]; e {
		case '\n':
		case '\\', '\'', '"':
			b.WriteByte(e)
		case 'a':
			b.WriteByte('\a')
		case 'b':
			b.WriteByte('\b')
		case 'f':
			b.WriteByte('\f')
		case 'n':
			b.WriteByte('\n')
		case 'r':
			b.WriteByte('\r')
		case 't':
			b.WriteByte('\t')
		case 'v':
			b.WriteByte('\v')
		case 'x', 'u', 'U':
			n := 2
			if e == 'u' {
				n = 4
			} else if e == 'U' {
				n = 8
			}
			if i+1+n <= len(s) {
				if v, err := strconv.ParseUint(s[i+1:i+1+n], 16, 32); err == nil {
					b.WriteRune(rune(v))
					i += n
					continue
				}
			}
			b.WriteByte('\\')
			b.WriteByte(e)
		case '0', '1', '2', '3', '4', '5', '6', '7':
			j := i
			for j < len(s) && j < i+3 && s[j] >= '0' && s[j] <= '7' {
				j++
			}
			v, _ := strconv.ParseUint(s[i:j], 8, 32)
			b.WriteRune(rune(v))
			i = j - 1
		default:
			b.WriteByte('\\')
			b.WriteByte(e)
		}
	}
	return b.String()
}
