package chat

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
)

// featureVars is the context of every feature snippet.
const featureVars = `{
 "s": "  Hello, World!  ", "t": "<think>\nplan\n</think>\n\nanswer", "csv": "a,b,,c",
 "n": 7, "f": 2.5, "neg": -3, "big": 12345678901, "z": 0, "yes": true, "no": false, "nil": null,
 "xs": [3, 1, 2], "names": ["b", "A", "c", "a"], "empty": [],
 "d": {"b": 1, "a": [1, 2], "c": {"x": "é"}}, "ed": {},
 "msgs": [{"role": "system", "content": "S"}, {"role": "user", "content": "U1"},
          {"role": "assistant", "content": "A1"}, {"role": "user", "content": "U2"}],
 "users": [{"name": "bo", "age": 30, "tags": ["x"]}, {"name": "al", "age": 25}, {"name": "cy", "age": 30}],
 "floats": [0.1, 1e-05, 1e16, 123456789.0, 1.5e300, -0.0, 100.0]
}`

// featureSnippets exercise the Jinja features chat templates use; each is
// rendered by the Go engine and by Python's jinja2 and must agree (or both
// fail).
var featureSnippets = []string{
	// whitespace control, trim_blocks and lstrip_blocks
	"a\n  {% if yes %}\n  b\n  {% endif %}\nc",
	"a  {%- if yes -%}  b  {%- endif -%}  c",
	"{% for x in xs %}\n  {{ x }}\n{% endfor %}",
	"x  {{- s -}}  y {{+ n }}",
	"  {# comment #}\nA\n{#- c -#}  B",
	"{% raw %}{{ not rendered }}{% endraw %}",
	"\n  {%+ if yes %}kept{% endif %}",
	"line\n    {{ n }}\n",
	// literals and operators
	"{{ 1 + 2 * 3 }}|{{ 7 // 2 }}|{{ -7 // 2 }}|{{ 7 % 3 }}|{{ -7 % 3 }}|{{ 7 / 2 }}|{{ 2 ** 10 }}|{{ 1.5 + 1 }}",
	"{{ 'a' ~ 1 ~ none ~ true }}|{{ 'ab' * 3 }}|{{ [1] + [2, 3] }}|{{ (1, 'a') }}|{{ (1,) }}",
	"{{ 'x' if n > 5 else 'y' }}|{{ 'x' if no }}|{{ n > 5 and n < 10 }}|{{ z or 'dflt' }}|{{ not nil }}",
	"{{ 1 < 2 < 3 }}|{{ 'b' > 'a' }}|{{ [1, 2] < [1, 3] }}|{{ 1 == 1.0 }}|{{ 'a' in 'cat' }}|{{ 'q' not in d }}|{{ 2 in xs }}",
	"{{ \"it's\" }}|{{ 'say \"hi\"' }}|{{ 'tab\\tnl\\nuni\\u00e9' }}|{{ 'a' 'b' }}",
	"{{ xs }}|{{ d }}|{{ names }}|{{ nil }}|{{ yes }}|{{ f }}|{{ big }}|{{ floats }}",
	"{{ {'k': 'v', 1: [none, false]} }}|{{ ['it\\'s', \"q\\\"\", '\\n'] }}",
	// attribute and item access, slicing
	"{{ d.b }}|{{ d['a'][1] }}|{{ d.a.0 }}|{{ d.c.x }}|{{ d.missing }}|{{ msgs[-1].content }}|{{ xs[5] }}",
	"{{ xs[::-1] }}|{{ xs[1:] }}|{{ xs[:-1] }}|{{ s[2:7] }}|{{ s[::2] }}|{{ msgs[1:3] | length }}|{{ 'héllo'[1] }}",
	// string methods
	"{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ t.split('</think>')[-1].lstrip('\\n') }}|{{ t.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') }}",
	"{{ csv.split(',') }}|{{ csv.split(',', 1) }}|{{ csv.rsplit(',', 1) }}|{{ '  a  b '.split() }}|{{ ' a b c '.split(none, 1) }}|{{ 'a\\nb\\r\\nc'.splitlines() }}",
	"{{ s.replace('l', 'L') }}|{{ s.replace('l', 'L', 2) }}|{{ 'ab'.replace('', '-') }}|{{ s.startswith('  He') }}|{{ s.endswith(('x', '  ')) }}",
	"{{ 'hello world'.title() }}|{{ \"they're bill's\".title() }}|{{ 'mIxEd'.upper() }}|{{ 'mIxEd'.lower() }}|{{ 'mIxEd'.capitalize() }}|{{ 'aBc'.swapcase() }}",
	"{{ 'xxhixx'.strip('x') }}|{{ '\\n\\nA\\n'.strip('\\n') }}|{{ s.find('o') }}|{{ s.count('l') }}|{{ '-'.join(['a', 'b']) }}|{{ '42'.isdigit() }}|{{ 'ab'.isalpha() }}",
	"{{ 'a{}b{}'.format(1, 'x') }}|{{ '{0}-{0}'.format('r') }}|{{ '{name}!'.format(name='N') }}|{{ 'k=v'.partition('=') }}|{{ '7'.zfill(3) }}|{{ 'ab'.center(6, '*') }}",
	// % formatting
	"{{ '%s' % 'x' }}|{{ '%s and %s' % ('a', 1) }}|{{ '%d items' % n }}|{{ '%.2f' % f }}|{{ '%5s|%-5s|' % ('r', 'l') }}|{{ '%r' % 'q' }}|{{ '%(a)s' % {'a': 1} }}|{{ '100%%' % () }}",
	// filters
	"{{ s | trim }}|{{ s | length }}|{{ xs | length }}|{{ d | length }}|{{ s | upper }}|{{ s | lower }}|{{ 'hello big-world' | title }}|{{ 'hELLO' | capitalize }}",
	"{{ xs | join(', ') }}|{{ users | join('/', attribute='name') }}|{{ xs | first }}|{{ xs | last }}|{{ empty | first }}|{{ 'abc' | list }}|{{ d | list }}",
	"{% for k, v in d | items %}{{ k }}={{ v }};{% endfor %}|{% for k, v in d.items() %}{{ k }};{% endfor %}|{{ d.keys() | list }}|{{ d.get('b') }}|{{ d.get('q', 'dflt') }}|{{ ed | items | list }}",
	"{{ xs | sort }}|{{ names | sort }}|{{ names | sort(case_sensitive=true) }}|{{ xs | sort(reverse=true) }}|{{ users | sort(attribute='age') | map(attribute='name') | list }}",
	"{{ d | dictsort }}|{{ names | unique | list }}|{{ xs | reverse | list }}|{{ xs | sum }}|{{ xs | min }}|{{ xs | max }}|{{ users | max(attribute='age') }}",
	"{{ users | selectattr('age', 'equalto', 30) | map(attribute='name') | join(',') }}|{{ users | rejectattr('tags') | list | length }}|{{ msgs | selectattr('role', 'eq', 'user') | list | length }}|{{ xs | select('odd') | list }}|{{ xs | reject('==', 2) | list }}",
	"{{ users | map(attribute='tags', default='none') | list }}|{{ names | map('upper') | list }}|{{ ['1', '2'] | map('int') | sum }}",
	"{{ nil | default('D') }}|{{ undefinedvar | default('U') }}|{{ '' | default('E', true) }}|{{ z | d('Z', boolean=true) }}",
	"{{ '3' | int + 1 }}|{{ 'x' | int }}|{{ 'x' | int(-1) }}|{{ 2.7 | int }}|{{ '1.5' | float }}|{{ neg | abs }}|{{ 2.567 | round(2) }}|{{ 2.5 | round }}|{{ 2.1 | round(0, 'ceil') }}",
	"{{ 'a\\nb\\n\\nc' | indent }}|{{ 'a\\nb' | indent(2, true) }}|{{ 'a\\n\\nb' | indent(2, blank=true) }}|{{ '<a href=\"x\">&' | e }}|{{ xs | string }}|{{ s | replace('l', '_') }}",
	"{{ d | tojson }}|{{ d | tojson(indent=2) }}|{{ msgs[0] | tojson(separators=(',', ':')) }}|{{ d | tojson(sort_keys=true) }}|{{ 'é' | tojson }}|{{ 'é😀' | tojson(ensure_ascii=true) }}|{{ floats | tojson }}|{{ nil | tojson }}",
	"{{ xs | batch(2) | list }}|{{ 'a long sentence here' | truncate(9, leeway=0) }}|{{ 'two words' | wordcount }}|{{ users | map(attribute='age') | unique | list }}",
	// tests
	"{{ n is defined }}|{{ q is defined }}|{{ q is undefined }}|{{ nil is none }}|{{ s is string }}|{{ d is mapping }}|{{ xs is iterable }}|{{ s is iterable }}|{{ n is number }}|{{ f is float }}|{{ n is integer }}|{{ yes is boolean }}|{{ yes is true }}",
	"{{ n is odd }}|{{ n is even }}|{{ n is divisibleby 7 }}|{{ n is equalto 7 }}|{{ n is eq(8) }}|{{ 'a' is lower }}|{{ 'A' is upper }}|{{ n is gt 3 }}|{{ 2 is in xs }}|{{ nil is not none }}|{{ xs is sequence }}|{{ d is sameas d }}",
	// statements
	"{% set a = 1 %}{% set b, c = 2, 3 %}{{ a + b + c }}{% set blk %}x{{ n }}y{% endset %}|{{ blk }}",
	"{% set ns = namespace(total=0, found=false) %}{% for x in xs %}{% set ns.total = ns.total + x %}{% if x == 2 %}{% set ns.found = true %}{% endif %}{% endfor %}{{ ns.total }}{{ ns.found }}",
	"{% set v = 1 %}{% for x in xs %}{% set v = x %}{% endfor %}{{ v }}",
	"{% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.previtem }}{{ loop.nextitem }}{{ loop.cycle('a', 'b') }};{% endfor %}",
	"{% for x in xs if x > 1 %}{{ x }}{{ loop.index }}{% else %}none{% endfor %}|{% for x in empty %}x{% else %}empty{% endfor %}",
	"{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 5 %}{% break %}{% endif %}{{ x }}{% endfor %}|{{ range(3) | list }}|{{ range(5, 0, -2) | list }}",
	"{% for k in d %}{{ k }}{% endfor %}|{% for a, b in [[1, 2], [3, 4]] %}{{ a * b }}{% endfor %}|{% for m in msgs[::-1] %}{{ m.role[0] }}{% endfor %}",
	"{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('A') }}|{{ greet('B', '?') }}|{{ greet(punct='.', name='C') }}",
	"{% macro m(x) %}[{{ x }}{{ varargs }}{{ kwargs }}]{% endmacro %}{{ m(1, 2, k=3) }}|{% macro w() %}<{{ caller() }}>{% endmacro %}{% call w() %}in{% endcall %}",
	"{% filter upper %}shout {{ n }}{% endfilter %}|{% set d2 = dict(a=1, b=2) %}{{ d2 }}|{{ namespace(a=1).a }}",
	"{% if msgs[0]['role'] == 'system' %}{% set sys = msgs[0]['content'] %}{% set rest = msgs[1:] %}{% endif %}{{ sys }}{{ rest | length }}",
	"{{ strftime_now('%d %b %Y') }}|{{ strftime_now('%Y-%m-%d %H:%M:%S %A %B %j %I%p') }}",
	// errors both sides must raise
	"{{ raise_exception('stop here') }}",
	"{{ 'a' + 1 }}",
	"{{ missing.attr }}",
	"{{ xs.append(4) }}",
	"{{ 1 / 0 }}",
	"{% for %}",
	"{{ '%d' % 'x' }}",
	"{{ undefinedvar + 1 }}",
	"{{ 1 < 'a' }}",
}

func TestTemplateFeaturesMatchReference(t *testing.T) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal([]byte(featureVars), &raw); err != nil {
		t.Fatal(err)
	}
	vars := map[string]any{}
	plain := map[string]any{}
	for k, v := range raw {
		val, ok := jsonValue(v)
		if !ok {
			t.Fatalf("bad var %s", k)
		}
		vars[k], plain[k] = val, v
	}
	cases := make([]refCase, len(featureSnippets))
	for i := range featureSnippets {
		cases[i] = refCase{ID: fmt.Sprint(i), Source: &featureSnippets[i], Vars: plain}
	}
	results := referenceRender(t, cases)
	failing := 0
	for i, r := range results {
		src := featureSnippets[i]
		var got string
		prog, err := parseTemplate(src)
		if err == nil {
			ctx := map[string]any{}
			for k, v := range vars {
				ctx[k] = v
			}
			got, err = renderProgram(prog, ctx, func() time.Time { return parityClock })
		}
		if r.Out == nil {
			failing++
			if err == nil {
				t.Errorf("%s\nreference fails (%s), Go rendered %q", src, r.Error, got)
			} else if r.Raised && err.Error() != strings.TrimPrefix(r.Error, "Raised: ") {
				t.Errorf("%s\nraised %q, reference %q", src, err, r.Error)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s\nGo error %v, reference %q", src, err, *r.Out)
			continue
		}
		if got != *r.Out {
			t.Errorf("%s\ngo  %q\nref %q", src, got, *r.Out)
		}
	}
	if failing != 9 {
		t.Errorf("%d snippets fail in the reference, want the 9 error cases", failing)
	}
}
