package diffusion

import (
	"encoding/json"
	"fmt"
	"html"
	"os"
	"regexp"
	"strings"
)

// clipTokenizer is CLIP's byte-level BPE tokenizer as diffusers pipelines
// ship it: tokenizer/vocab.json (token -> id), tokenizer/merges.txt (one
// merge per line, rank = line order) and tokenizer_config.json. Each word
// is split into byte symbols, the last one marked with "</w>", and the
// lowest-ranked adjacent pair is merged (every occurrence) until no ranked
// pair is left, as OpenAI's simple_tokenizer does. Text is lower-cased and
// its whitespace collapsed first (ftfy's repairs are not applied).
type clipTokenizer struct {
	vocab    map[string]int64
	ranks    map[[2]string]int
	byteSym  [256]string
	pat      *regexp.Regexp
	bos, eos int64
	pad      int64
	maxLen   int
}

// clipPattern is CLIP's pre-tokenizer: the special tokens, English
// contractions, runs of letters, single digits and runs of other
// non-space characters.
const clipPattern = `(?i)<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|\p{L}+|\p{N}|[^\s\p{L}\p{N}]+`

// clipBytes is GPT-2's reversible byte -> printable rune table.
func clipBytes() [256]string {
	var t [256]string
	n := 0
	for b := range 256 {
		switch {
		case b >= '!' && b <= '~', b >= 0xa1 && b <= 0xac, b >= 0xae && b <= 0xff:
			t[b] = string(rune(b))
		default:
			t[b] = string(rune(256 + n))
			n++
		}
	}
	return t
}

// loadCLIP reads the vocabulary, the merges and (optional, "" to skip) the
// tokenizer config (pad_token, model_max_length); maxLen > 0 overrides the
// config's length (the text encoder's static sequence length).
func loadCLIP(vocabPath, mergesPath, configPath string, maxLen int) (*clipTokenizer, error) {
	raw, err := os.ReadFile(vocabPath)
	if err != nil {
		return nil, fmt.Errorf("tokenizer vocab: %w", err)
	}
	t := &clipTokenizer{ranks: map[[2]string]int{}, byteSym: clipBytes(), pat: regexp.MustCompile(clipPattern), maxLen: 77}
	if err := json.Unmarshal(raw, &t.vocab); err != nil {
		return nil, fmt.Errorf("tokenizer vocab %s: %w", vocabPath, err)
	}
	raw, err = os.ReadFile(mergesPath)
	if err != nil {
		return nil, fmt.Errorf("tokenizer merges: %w", err)
	}
	for i, line := range strings.Split(string(raw), "\n") {
		line = strings.TrimRight(line, "\r")
		if line == "" || (i == 0 && strings.HasPrefix(line, "#version")) {
			continue
		}
		a, b, ok := strings.Cut(line, " ")
		if !ok {
			return nil, fmt.Errorf("tokenizer merges %s line %d: %q is not two symbols", mergesPath, i+1, line)
		}
		if _, dup := t.ranks[[2]string{a, b}]; !dup {
			t.ranks[[2]string{a, b}] = len(t.ranks)
		}
	}
	var ok bool
	if t.bos, ok = t.vocab["<|startoftext|>"]; !ok {
		return nil, fmt.Errorf("tokenizer vocab has no <|startoftext|>")
	}
	if t.eos, ok = t.vocab["<|endoftext|>"]; !ok {
		return nil, fmt.Errorf("tokenizer vocab has no <|endoftext|>")
	}
	t.pad = t.eos
	if configPath != "" {
		if err := t.readConfig(configPath); err != nil {
			return nil, err
		}
	}
	if maxLen > 0 {
		t.maxLen = maxLen
	}
	if t.maxLen < 2 {
		return nil, fmt.Errorf("tokenizer max length %d is below 2", t.maxLen)
	}
	return t, nil
}

// readConfig takes pad_token and model_max_length from a tokenizer_config
// or special_tokens_map JSON; a token may be a string or {"content": ...}.
func (t *clipTokenizer) readConfig(path string) error {
	raw, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("tokenizer config: %w", err)
	}
	var c struct {
		Pad    json.RawMessage `json:"pad_token"`
		MaxLen float64         `json:"model_max_length"`
	}
	if err := json.Unmarshal(raw, &c); err != nil {
		return fmt.Errorf("tokenizer config %s: %w", path, err)
	}
	if c.MaxLen > 0 && c.MaxLen < 1<<16 {
		t.maxLen = int(c.MaxLen)
	}
	if len(c.Pad) > 0 && string(c.Pad) != "null" {
		var s string
		if json.Unmarshal(c.Pad, &s) != nil {
			var o struct {
				Content string `json:"content"`
			}
			if err := json.Unmarshal(c.Pad, &o); err != nil {
				return fmt.Errorf("tokenizer config %s: pad_token: %w", path, err)
			}
			s = o.Content
		}
		id, ok := t.vocab[s]
		if !ok {
			return fmt.Errorf("tokenizer config %s: pad_token %q is not in the vocabulary", path, s)
		}
		t.pad = id
	}
	return nil
}

// encode returns <|startoftext|> text-tokens <|endoftext|>, cut to maxLen
// and padded to it with the pad token, and the number of text tokens kept.
func (t *clipTokenizer) encode(text string) ([]int64, int) {
	text = strings.ToLower(strings.Join(strings.Fields(html.UnescapeString(html.UnescapeString(text))), " "))
	ids := make([]int64, 0, t.maxLen)
	ids = append(ids, t.bos)
	var sb strings.Builder
	for _, piece := range t.pat.FindAllString(text, -1) {
		if id, ok := t.vocab[piece]; ok && (piece == "<|startoftext|>" || piece == "<|endoftext|>") {
			ids = append(ids, id)
			continue
		}
		sb.Reset()
		for i := 0; i < len(piece); i++ {
			sb.WriteString(t.byteSym[piece[i]])
		}
		for _, sym := range t.bpe(sb.String()) {
			if id, ok := t.vocab[sym]; ok {
				ids = append(ids, id)
			}
		}
		if len(ids) >= t.maxLen-1 {
			break
		}
	}
	ids = ids[:min(len(ids), t.maxLen-1)]
	kept := len(ids) - 1
	ids = append(ids, t.eos)
	for len(ids) < t.maxLen {
		ids = append(ids, t.pad)
	}
	return ids, kept
}

// bpe splits word (byte symbols) into vocabulary symbols.
func (t *clipTokenizer) bpe(word string) []string {
	rs := []rune(word)
	if len(rs) == 0 {
		return nil
	}
	syms := make([]string, len(rs))
	for i, r := range rs {
		syms[i] = string(r)
	}
	syms[len(syms)-1] += "</w>"
	for len(syms) > 1 {
		best, bestRank := [2]string{}, -1
		for i := 0; i+1 < len(syms); i++ {
			p := [2]string{syms[i], syms[i+1]}
			if r, ok := t.ranks[p]; ok && (bestRank < 0 || r < bestRank) {
				best, bestRank = p, r
			}
		}
		if bestRank < 0 {
			break
		}
		out := syms[:0:0]
		for i := 0; i < len(syms); i++ {
			if i+1 < len(syms) && syms[i] == best[0] && syms[i+1] == best[1] {
				out = append(out, syms[i]+syms[i+1])
				i++
				continue
			}
			out = append(out, syms[i])
		}
		syms = out
	}
	return syms
}
