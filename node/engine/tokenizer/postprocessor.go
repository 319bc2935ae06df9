package tokenizer

// PostProcessor wraps one encoded sequence in the model's special tokens.
type PostProcessor interface {
	// AddedTokens is how many tokens Process adds to a single sequence.
	AddedTokens() int
	// Process returns the final ids and type ids for the sequence ids.
	Process(ids []int64) (outIDs, typeIDs []int64)
}

// TemplatePiece is one element of a single-sequence template: either the
// sequence itself (Special empty) or a run of special-token ids.
type TemplatePiece struct {
	// Special holds the special token ids; empty means "the sequence".
	Special []int64
	// TypeID is the token type id given to the piece's tokens.
	TypeID int64
}

// Template is Hugging Face's TemplateProcessing (and, for single sequences,
// BertProcessing and RobertaProcessing, which are "[CLS] $A [SEP]").
type Template struct {
	// Pieces lay out the output in order: runs of special ids and the
	// sequence itself.
	Pieces []TemplatePiece
}

// AddedTokens counts the special ids in the template.
func (t Template) AddedTokens() int {
	n := 0
	for _, p := range t.Pieces {
		n += len(p.Special)
	}
	return n
}

// Process lays the sequence out along the template.
func (t Template) Process(ids []int64) (outIDs, typeIDs []int64) {
	n := len(ids) + t.AddedTokens()
	outIDs = make([]int64, 0, n)
	typeIDs = make([]int64, 0, n)
	for _, p := range t.Pieces {
		src := p.Special
		if len(src) == 0 {
			src = ids
		}
		outIDs = append(outIDs, src...)
		for range src {
			typeIDs = append(typeIDs, p.TypeID)
		}
	}
	return outIDs, typeIDs
}
