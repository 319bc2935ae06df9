package chat

import (
	"fmt"
	"slices"
)

// Statement nodes.
type (
	stmt      any
	textStmt  struct{ s string }
	printStmt struct{ e expr }
	ifStmt    struct {
		conds  []expr
		bodies [][]stmt
		els    []stmt
	}
	forStmt struct {
		targets []string // one name, or several to unpack
		iter    expr
		cond    expr // nil: no filter
		body    []stmt
		els     []stmt
	}
	// setStmt assigns value (or, with body, the rendered body through
	// filters) to names, or to ns.attr when attr is set.
	setStmt struct {
		names   []string
		attr    string
		value   expr
		body    []stmt
		filters []*filterExpr
	}
	macroStmt struct {
		name     string
		params   []string
		defaults []expr // aligned to the end of params
		body     []stmt
	}
	callBlockStmt struct {
		params   []string
		defaults []expr
		call     *callExpr
		body     []stmt
	}
	filterBlockStmt struct {
		filters []*filterExpr
		body    []stmt
	}
	// scopeStmt renders body in a child scope: transformers' {% generation %}
	// block, which jinja2 runs as a call block.
	scopeStmt    struct{ body []stmt }
	breakStmt    struct{}
	continueStmt struct{}
)

// Expression nodes.
type (
	expr      any
	constExpr struct{ v any }
	nameExpr  struct{ name string }
	listExpr  struct{ items []expr }
	tupleExpr struct{ items []expr }
	dictExpr  struct{ keys, vals []expr }
	attrExpr  struct {
		obj  expr
		name string
	}
	itemExpr  struct{ obj, key expr }
	sliceExpr struct {
		obj               expr
		start, stop, step expr // nil when omitted
	}
	callExpr struct {
		fn       expr
		args     []expr
		kwNames  []string
		kwVals   []expr
		starArgs expr // *args, or nil
		starKw   expr // **kwargs, or nil
	}
	filterExpr struct {
		obj  expr // nil inside filter blocks
		name string
		call callExpr // args only
	}
	testExpr struct {
		obj    expr
		name   string
		negate bool
		call   callExpr
	}
	unaryExpr struct {
		op string // "-", "+", "not"
		x  expr
	}
	binExpr struct {
		op   string // + - * / // % ** ~ and or
		l, r expr
	}
	compareExpr struct {
		first expr
		ops   []string // == != < <= > >= in notin
		rest  []expr
	}
	condExpr struct{ cond, yes, no expr } // no may be nil
)

type parser struct {
	toks []token
	i    int
}

// syntaxError reports a template syntax error at the current token.
func (p *parser) errorf(format string, args ...any) error {
	return &lexError{p.cur().line, fmt.Sprintf(format, args...)}
}

func (p *parser) cur() token  { return p.toks[p.i] }
func (p *parser) next() token { t := p.toks[p.i]; p.i++; return t }

func (p *parser) isOp(op string) bool { return p.cur().kind == tkOp && p.cur().val == op }
func (p *parser) isName(n string) bool {
	return p.cur().kind == tkName && p.cur().val == n
}

func (p *parser) expectOp(op string) error {
	if !p.isOp(op) {
		return p.errorf("expected '%s', got %s", op, p.describe())
	}
	p.i++
	return nil
}

func (p *parser) describe() string {
	t := p.cur()
	switch t.kind {
	case tkEOF:
		return "end of template"
	case tkBlockEnd:
		return "end of statement block"
	case tkVarEnd:
		return "end of print statement"
	case tkString:
		return "string"
	}
	return fmt.Sprintf("'%s'", t.val)
}

func (p *parser) expectName() (string, error) {
	if p.cur().kind != tkName {
		return "", p.errorf("expected a name, got %s", p.describe())
	}
	return p.next().val, nil
}

func (p *parser) expectBlockEnd() error {
	if p.cur().kind != tkBlockEnd {
		return p.errorf("expected end of statement block, got %s", p.describe())
	}
	p.i++
	return nil
}

// parseTemplate parses a whole template.
func parseTemplate(src string) ([]stmt, error) {
	toks, err := lexTemplate(src)
	if err != nil {
		return nil, err
	}
	p := &parser{toks: toks}
	body, end, err := p.parseBody(nil)
	if err != nil {
		return nil, err
	}
	if end != "" {
		return nil, p.errorf("unexpected '%s'", end)
	}
	return body, nil
}

// parseBody parses statements until a block tag named in ends (returned,
// with the parser after the tag name) or the end of the template ("").
func (p *parser) parseBody(ends []string) ([]stmt, string, error) {
	var out []stmt
	for {
		t := p.cur()
		switch t.kind {
		case tkEOF:
			if len(ends) > 0 {
				return nil, "", p.errorf("unexpected end of template, expected '%s'", ends[0])
			}
			return out, "", nil
		case tkText:
			p.i++
			out = append(out, &textStmt{t.val})
		case tkVarBegin:
			p.i++
			e, err := p.parseTuple(true)
			if err != nil {
				return nil, "", err
			}
			if p.cur().kind != tkVarEnd {
				return nil, "", p.errorf("expected end of print statement, got %s", p.describe())
			}
			p.i++
			out = append(out, &printStmt{e})
		case tkBlockBegin:
			p.i++
			name, err := p.expectName()
			if err != nil {
				return nil, "", err
			}
			if slices.Contains(ends, name) {
				return out, name, nil
			}
			s, err := p.parseStatement(name)
			if err != nil {
				return nil, "", err
			}
			out = append(out, s)
		default:
			return nil, "", p.errorf("unexpected %s", p.describe())
		}
	}
}

func (p *parser) parseStatement(name string) (stmt, error) {
	switch name {
	case "if":
		return p.parseIf()
	case "for":
		return p.parseFor()
	case "set":
		return p.parseSet()
	case "macro":
		return p.parseMacro()
	case "call":
		return p.parseCallBlock()
	case "filter":
		return p.parseFilterBlock()
	case "generation":
		if err := p.expectBlockEnd(); err != nil {
			return nil, err
		}
		body, _, err := p.parseBody([]string{"endgeneration"})
		if err != nil {
			return nil, err
		}
		return &scopeStmt{body}, p.expectBlockEnd()
	case "break", "continue":
		if err := p.expectBlockEnd(); err != nil {
			return nil, err
		}
		if name == "break" {
			return &breakStmt{}, nil
		}
		return &continueStmt{}, nil
	}
	return nil, p.errorf("unknown tag '%s'", name)
}

func (p *parser) parseIf() (stmt, error) {
	s := &ifStmt{}
	for {
		cond, err := p.parseTuple(false)
		if err != nil {
			return nil, err
		}
		if err := p.expectBlockEnd(); err != nil {
			return nil, err
		}
		body, end, err := p.parseBody([]string{"elif", "else", "endif"})
		if err != nil {
			return nil, err
		}
		s.conds, s.bodies = append(s.conds, cond), append(s.bodies, body)
		switch end {
		case "elif":
			continue
		case "else":
			if err := p.expectBlockEnd(); err != nil {
				return nil, err
			}
			if s.els, _, err = p.parseBody([]string{"endif"}); err != nil {
				return nil, err
			}
		}
		return s, p.expectBlockEnd()
	}
}

func (p *parser) parseFor() (stmt, error) {
	s := &forStmt{}
	for {
		n, err := p.expectName()
		if err != nil {
			return nil, err
		}
		s.targets = append(s.targets, n)
		if !p.isOp(",") {
			break
		}
		p.i++
	}
	if !p.isName("in") {
		return nil, p.errorf("expected 'in', got %s", p.describe())
	}
	p.i++
	iter, err := p.parseTuple(false)
	if err != nil {
		return nil, err
	}
	s.iter = iter
	if p.isName("if") {
		p.i++
		if s.cond, err = p.parseExpr(true); err != nil {
			return nil, err
		}
	}
	if p.isName("recursive") {
		return nil, p.errorf("recursive loops are not supported")
	}
	if err := p.expectBlockEnd(); err != nil {
		return nil, err
	}
	body, end, err := p.parseBody([]string{"else", "endfor"})
	if err != nil {
		return nil, err
	}
	s.body = body
	if end == "else" {
		if err := p.expectBlockEnd(); err != nil {
			return nil, err
		}
		if s.els, _, err = p.parseBody([]string{"endfor"}); err != nil {
			return nil, err
		}
	}
	return s, p.expectBlockEnd()
}

func (p *parser) parseSet() (stmt, error) {
	s := &setStmt{}
	first, err := p.expectName()
	if err != nil {
		return nil, err
	}
	s.names = []string{first}
	switch {
	case p.isOp("."):
		p.i++
		if s.attr, err = p.expectName(); err != nil {
			return nil, err
		}
	case p.isOp(","):
		for p.isOp(",") {
			p.i++
			n, err := p.expectName()
			if err != nil {
				return nil, err
			}
			s.names = append(s.names, n)
		}
	}
	if p.isOp("=") {
		p.i++
		if s.value, err = p.parseTuple(true); err != nil {
			return nil, err
		}
		return s, p.expectBlockEnd()
	}
	for p.isOp("|") {
		p.i++
		f, err := p.parseFilter(nil)
		if err != nil {
			return nil, err
		}
		s.filters = append(s.filters, f)
	}
	if err := p.expectBlockEnd(); err != nil {
		return nil, err
	}
	if s.body, _, err = p.parseBody([]string{"endset"}); err != nil {
		return nil, err
	}
	return s, p.expectBlockEnd()
}

// parseSignature parses "(a, b=1)" of a macro or call block.
func (p *parser) parseSignature() ([]string, []expr, error) {
	var params []string
	var defaults []expr
	if err := p.expectOp("("); err != nil {
		return nil, nil, err
	}
	for !p.isOp(")") {
		if len(params) > 0 {
			if err := p.expectOp(","); err != nil {
				return nil, nil, err
			}
		}
		n, err := p.expectName()
		if err != nil {
			return nil, nil, err
		}
		params = append(params, n)
		if p.isOp("=") {
			p.i++
			d, err := p.parseExpr(true)
			if err != nil {
				return nil, nil, err
			}
			defaults = append(defaults, d)
		} else if len(defaults) > 0 {
			return nil, nil, p.errorf("non-default argument follows default argument")
		}
	}
	p.i++
	return params, defaults, nil
}

func (p *parser) parseMacro() (stmt, error) {
	name, err := p.expectName()
	if err != nil {
		return nil, err
	}
	params, defaults, err := p.parseSignature()
	if err != nil {
		return nil, err
	}
	if err := p.expectBlockEnd(); err != nil {
		return nil, err
	}
	body, _, err := p.parseBody([]string{"endmacro"})
	if err != nil {
		return nil, err
	}
	if p.cur().kind == tkName {
		p.i++ // {% endmacro name %}
	}
	return &macroStmt{name: name, params: params, defaults: defaults, body: body}, p.expectBlockEnd()
}

func (p *parser) parseCallBlock() (stmt, error) {
	s := &callBlockStmt{}
	var err error
	if p.isOp("(") {
		if s.params, s.defaults, err = p.parseSignature(); err != nil {
			return nil, err
		}
	}
	e, err := p.parseExpr(true)
	if err != nil {
		return nil, err
	}
	c, ok := e.(*callExpr)
	if !ok {
		return nil, p.errorf("expected a call")
	}
	s.call = c
	if err := p.expectBlockEnd(); err != nil {
		return nil, err
	}
	if s.body, _, err = p.parseBody([]string{"endcall"}); err != nil {
		return nil, err
	}
	return s, p.expectBlockEnd()
}

func (p *parser) parseFilterBlock() (stmt, error) {
	s := &filterBlockStmt{}
	for {
		f, err := p.parseFilter(nil)
		if err != nil {
			return nil, err
		}
		s.filters = append(s.filters, f)
		if !p.isOp("|") {
			break
		}
		p.i++
	}
	if err := p.expectBlockEnd(); err != nil {
		return nil, err
	}
	var err error
	if s.body, _, err = p.parseBody([]string{"endfilter"}); err != nil {
		return nil, err
	}
	return s, p.expectBlockEnd()
}
