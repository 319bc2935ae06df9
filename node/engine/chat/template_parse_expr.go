package chat

// Expression parsing, with jinja2's precedence from loosest to tightest:
// conditional (x if c else y), or, and, not, comparisons (== != < <= > >=
// in, not in), + -, ~, * / // %, **, unary - +, then primaries with their
// postfixes (.attr, [index], [a:b:c], (call)), filters (|f) and tests (is t).

// parseTuple parses an expression, or a tuple when commas follow.
func (p *parser) parseTuple(withCond bool) (expr, error) {
	first, err := p.parseExpr(withCond)
	if err != nil {
		return nil, err
	}
	if !p.isOp(",") {
		return first, nil
	}
	items := []expr{first}
	for p.isOp(",") {
		p.i++
		if !p.canStartExpr() {
			break
		}
		e, err := p.parseExpr(withCond)
		if err != nil {
			return nil, err
		}
		items = append(items, e)
	}
	return &tupleExpr{items}, nil
}

func (p *parser) canStartExpr() bool {
	t := p.cur()
	switch t.kind {
	case tkName, tkString, tkInt, tkFloat:
		return true
	case tkOp:
		switch t.val {
		case "(", "[", "{", "-", "+":
			return true
		}
	}
	return false
}

func (p *parser) parseExpr(withCond bool) (expr, error) {
	if !withCond {
		return p.parseOr()
	}
	e, err := p.parseOr()
	if err != nil {
		return nil, err
	}
	for p.isName("if") {
		p.i++
		cond, err := p.parseOr()
		if err != nil {
			return nil, err
		}
		var no expr
		if p.isName("else") {
			p.i++
			if no, err = p.parseExpr(true); err != nil {
				return nil, err
			}
		}
		e = &condExpr{cond: cond, yes: e, no: no}
	}
	return e, nil
}

func (p *parser) parseOr() (expr, error) {
	l, err := p.parseAnd()
	for err == nil && p.isName("or") {
		p.i++
		var r expr
		if r, err = p.parseAnd(); err == nil {
			l = &binExpr{"or", l, r}
		}
	}
	return l, err
}

func (p *parser) parseAnd() (expr, error) {
	l, err := p.parseNot()
	for err == nil && p.isName("and") {
		p.i++
		var r expr
		if r, err = p.parseNot(); err == nil {
			l = &binExpr{"and", l, r}
		}
	}
	return l, err
}

func (p *parser) parseNot() (expr, error) {
	if p.isName("not") {
		p.i++
		x, err := p.parseNot()
		if err != nil {
			return nil, err
		}
		return &unaryExpr{"not", x}, nil
	}
	return p.parseCompare()
}

func (p *parser) parseCompare() (expr, error) {
	first, err := p.parseBinary(0)
	if err != nil {
		return nil, err
	}
	c := &compareExpr{first: first}
	for {
		var op string
		switch {
		case p.cur().kind == tkOp && (p.isOp("==") || p.isOp("!=") || p.isOp("<") || p.isOp("<=") || p.isOp(">") || p.isOp(">=")):
			op = p.cur().val
			p.i++
		case p.isName("in"):
			op = "in"
			p.i++
		case p.isName("not") && p.toks[p.i+1].kind == tkName && p.toks[p.i+1].val == "in":
			op = "notin"
			p.i += 2
		}
		if op == "" {
			break
		}
		r, err := p.parseBinary(0)
		if err != nil {
			return nil, err
		}
		c.ops, c.rest = append(c.ops, op), append(c.rest, r)
	}
	if len(c.ops) == 0 {
		return first, nil
	}
	return c, nil
}

// binaryLevels lists the arithmetic operators by increasing precedence.
func binaryLevel(level int) []string {
	switch level {
	case 0:
		return []string{"+", "-"}
	case 1:
		return []string{"~"}
	case 2:
		return []string{"*", "/", "//", "%"}
	case 3:
		return []string{"**"}
	}
	return nil
}

func (p *parser) parseBinary(level int) (expr, error) {
	ops := binaryLevel(level)
	if ops == nil {
		return p.parseUnary(true)
	}
	l, err := p.parseBinary(level + 1)
	if err != nil {
		return nil, err
	}
	for {
		op := ""
		if p.cur().kind == tkOp {
			for _, o := range ops {
				if p.cur().val == o {
					op = o
				}
			}
		}
		if op == "" {
			return l, nil
		}
		p.i++
		r, err := p.parseBinary(level + 1)
		if err != nil {
			return nil, err
		}
		l = &binExpr{op, l, r}
	}
}

func (p *parser) parseUnary(withFilter bool) (expr, error) {
	var node expr
	var err error
	switch {
	case p.isOp("-"), p.isOp("+"):
		op := p.next().val
		x, err := p.parseUnary(false)
		if err != nil {
			return nil, err
		}
		node = &unaryExpr{op, x}
	default:
		if node, err = p.parsePrimary(); err != nil {
			return nil, err
		}
	}
	if node, err = p.parsePostfix(node); err != nil {
		return nil, err
	}
	if withFilter {
		return p.parseFilterExpr(node)
	}
	return node, nil
}

func (p *parser) parsePrimary() (expr, error) {
	t := p.cur()
	switch t.kind {
	case tkName:
		p.i++
		switch t.val {
		case "true", "True":
			return &constExpr{true}, nil
		case "false", "False":
			return &constExpr{false}, nil
		case "none", "None":
			return &constExpr{nil}, nil
		}
		return &nameExpr{t.val}, nil
	case tkString:
		p.i++
		s := t.val
		for p.cur().kind == tkString {
			s += p.next().val
		}
		return &constExpr{s}, nil
	case tkInt, tkFloat:
		p.i++
		return &constExpr{t.num}, nil
	case tkOp:
		switch t.val {
		case "(":
			p.i++
			if p.isOp(")") {
				p.i++
				return &tupleExpr{}, nil
			}
			e, err := p.parseTuple(true)
			if err != nil {
				return nil, err
			}
			return e, p.expectOp(")")
		case "[":
			p.i++
			l := &listExpr{}
			for !p.isOp("]") {
				if len(l.items) > 0 {
					if err := p.expectOp(","); err != nil {
						return nil, err
					}
					if p.isOp("]") {
						break
					}
				}
				e, err := p.parseExpr(true)
				if err != nil {
					return nil, err
				}
				l.items = append(l.items, e)
			}
			p.i++
			return l, nil
		case "{":
			p.i++
			d := &dictExpr{}
			for !p.isOp("}") {
				if len(d.keys) > 0 {
					if err := p.expectOp(","); err != nil {
						return nil, err
					}
					if p.isOp("}") {
						break
					}
				}
				k, err := p.parseExpr(true)
				if err != nil {
					return nil, err
				}
				if err := p.expectOp(":"); err != nil {
					return nil, err
				}
				v, err := p.parseExpr(true)
				if err != nil {
					return nil, err
				}
				d.keys, d.vals = append(d.keys, k), append(d.vals, v)
			}
			p.i++
			return d, nil
		}
	}
	return nil, p.errorf("unexpected %s", p.describe())
}

func (p *parser) parsePostfix(node expr) (expr, error) {
	for {
		var err error
		switch {
		case p.isOp("."):
			p.i++
			t := p.next()
			switch t.kind {
			case tkName:
				node = &attrExpr{node, t.val}
			case tkInt:
				node = &itemExpr{node, &constExpr{t.num}}
			default:
				p.i--
				return nil, p.errorf("expected a name after '.'")
			}
		case p.isOp("["):
			p.i++
			if node, err = p.parseSubscript(node); err != nil {
				return nil, err
			}
		case p.isOp("("):
			if node, err = p.parseCall(node); err != nil {
				return nil, err
			}
		default:
			return node, nil
		}
	}
}

// parseSubscript parses what follows "[": an index or a slice.
func (p *parser) parseSubscript(obj expr) (expr, error) {
	var parts [3]expr
	colons := 0
	for {
		if !p.isOp(":") && !p.isOp("]") {
			e, err := p.parseExpr(true)
			if err != nil {
				return nil, err
			}
			parts[colons] = e
		}
		if p.isOp("]") {
			p.i++
			break
		}
		if err := p.expectOp(":"); err != nil {
			return nil, err
		}
		if colons++; colons > 2 {
			return nil, p.errorf("invalid slice")
		}
	}
	if colons == 0 {
		if parts[0] == nil {
			return nil, p.errorf("empty subscript")
		}
		return &itemExpr{obj, parts[0]}, nil
	}
	return &sliceExpr{obj, parts[0], parts[1], parts[2]}, nil
}

// parseArgs parses "(a, k=v)" into c.
func (p *parser) parseArgs(c *callExpr) error {
	if err := p.expectOp("("); err != nil {
		return err
	}
	for !p.isOp(")") {
		if len(c.args)+len(c.kwVals) > 0 || c.starArgs != nil || c.starKw != nil {
			if err := p.expectOp(","); err != nil {
				return err
			}
			if p.isOp(")") {
				break
			}
		}
		if p.isOp("*") || p.isOp("**") {
			star := p.next().val
			v, err := p.parseExpr(true)
			if err != nil {
				return err
			}
			if star == "*" {
				c.starArgs = v
			} else {
				c.starKw = v
			}
			continue
		}
		if p.cur().kind == tkName && p.toks[p.i+1].kind == tkOp && p.toks[p.i+1].val == "=" {
			name := p.next().val
			p.i++
			v, err := p.parseExpr(true)
			if err != nil {
				return err
			}
			c.kwNames, c.kwVals = append(c.kwNames, name), append(c.kwVals, v)
			continue
		}
		if len(c.kwVals) > 0 {
			return p.errorf("positional argument follows keyword argument")
		}
		v, err := p.parseExpr(true)
		if err != nil {
			return err
		}
		c.args = append(c.args, v)
	}
	p.i++
	return nil
}

func (p *parser) parseCall(fn expr) (expr, error) {
	c := &callExpr{fn: fn}
	return c, p.parseArgs(c)
}

func (p *parser) parseFilterExpr(node expr) (expr, error) {
	for {
		var err error
		switch {
		case p.isOp("|"):
			p.i++
			if node, err = p.parseFilter(node); err != nil {
				return nil, err
			}
		case p.isName("is"):
			p.i++
			if node, err = p.parseTest(node); err != nil {
				return nil, err
			}
		case p.isOp("("):
			if node, err = p.parseCall(node); err != nil {
				return nil, err
			}
		default:
			return node, nil
		}
	}
}

func (p *parser) parseFilter(obj expr) (*filterExpr, error) {
	name, err := p.expectName()
	if err != nil {
		return nil, err
	}
	for p.isOp(".") {
		p.i++
		n, err := p.expectName()
		if err != nil {
			return nil, err
		}
		name += "." + n
	}
	f := &filterExpr{obj: obj, name: name}
	if p.isOp("(") {
		if err := p.parseArgs(&f.call); err != nil {
			return nil, err
		}
	}
	return f, nil
}

func (p *parser) parseTest(obj expr) (expr, error) {
	t := &testExpr{obj: obj}
	if p.isName("not") {
		p.i++
		t.negate = true
	}
	name, err := p.expectName()
	if err != nil {
		return nil, err
	}
	t.name = name
	cur := p.cur()
	switch {
	case p.isOp("("):
		if err := p.parseArgs(&t.call); err != nil {
			return nil, err
		}
	case (cur.kind == tkName || cur.kind == tkString || cur.kind == tkInt || cur.kind == tkFloat ||
		p.isOp("(") || p.isOp("[") || p.isOp("{")) && !p.isName("else") && !p.isName("or") && !p.isName("and"):
		if p.isName("is") {
			return nil, p.errorf("you cannot chain multiple tests with is")
		}
		arg, err := p.parsePrimary()
		if err != nil {
			return nil, err
		}
		if arg, err = p.parsePostfix(arg); err != nil {
			return nil, err
		}
		t.call.args = []expr{arg}
	}
	return t, nil
}
