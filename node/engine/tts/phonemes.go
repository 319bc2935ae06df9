package tts

import (
	"regexp"
	"strings"
)

// Kokoro phoneme normalisation.
//
// Kokoro was trained on misaki phonemes, a variant of espeak-ng IPA in
// which each diphthong and affricate is one symbol. The mapping below turns
// espeak-ng --ipa=3 output (multi-letter phonemes tied with U+200D) into
// that set, then drops whatever the model's vocabulary lacks:
//
//   - ties, all languages: a‍ɪ→I, a‍ʊ→W, e‍ɪ→A, o‍ʊ→O, ə‍ʊ→Q, ɔ‍ɪ→Y,
//     d‍ʒ→ʤ, t‍ʃ→ʧ, d‍z→ʣ, t‍s→ʦ, s‍s→S; untied dʒ→ʤ and tʃ→ʧ as
//     well; any other tie is removed (its letters stay);
//   - all languages: ʲ→j (palatalisation), '-' removed;
//   - English voices only: r→ɹ, x→k, ç→k, ɬ→l, ɐ→ə (symbols the English
//     training data never used);
//   - " z" before punctuation or the end becomes "z" (espeak-ng writes a
//     detached plural/possessive s);
//   - punctuation: « → “, » → ”, [ and { → (, ] and } → ), ¡ and ¿
//     dropped;
//   - espeak-ng language-switch marks such as "(en)" are removed (in
//     phonemizePieces), runs of spaces collapse to one, and every rune not in
//     the vocabulary is dropped.
var kokoroTies = strings.NewReplacer(
	"a"+zwj+"ɪ", "I", "a"+zwj+"ʊ", "W", "e"+zwj+"ɪ", "A", "o"+zwj+"ʊ", "O",
	"ə"+zwj+"ʊ", "Q", "ɔ"+zwj+"ɪ", "Y", "d"+zwj+"ʒ", "ʤ", "t"+zwj+"ʃ", "ʧ",
	"d"+zwj+"z", "ʣ", "t"+zwj+"s", "ʦ", "s"+zwj+"s", "S",
	"dʒ", "ʤ", "tʃ", "ʧ",
)

var kokoroCommon = strings.NewReplacer(
	zwj, "", "ʲ", "j", "-", "",
	"«", "“", "»", "”", "[", "(", "{", "(", "]", ")", "}", ")", "¡", "", "¿", "",
)

var kokoroEnglish = strings.NewReplacer("r", "ɹ", "x", "k", "ç", "k", "ɬ", "l", "ɐ", "ə")

// currency matches a currency sign before an amount.
var currency = regexp.MustCompile(`([$€£])\s?(\d[\d,]*(?:\.\d+)?)`)

// prenormalize fixes, before espeak-ng, what its English text normalisation
// gets wrong: it reads "$12" as "dollar twelve", so currency signs before an
// amount are moved after it as words ("12 dollars").
func prenormalize(s string, english bool) string {
	if !english || !strings.ContainsAny(s, "$€£") {
		return s
	}
	return currency.ReplaceAllStringFunc(s, func(m string) string {
		sub := currency.FindStringSubmatch(m)
		word := map[string]string{"$": "dollars", "€": "euros", "£": "pounds"}[sub[1]]
		return sub[2] + " " + word
	})
}

var detachedZ = regexp.MustCompile(` z([;:,.!?—…"“”() ]|$)`)

// normalize maps espeak-ng IPA to Kokoro's vocabulary (see above).
func (k *Kokoro) normalize(ipa string, english bool) string {
	s := kokoroTies.Replace(ipa)
	s = kokoroCommon.Replace(s)
	if english {
		s = kokoroEnglish.Replace(s)
	}
	s = detachedZ.ReplaceAllString(s, "z$1")
	var b strings.Builder
	space := true // drops leading spaces and collapses runs
	for _, r := range s {
		if r == ' ' || r == '\t' || r == '\n' {
			if !space {
				b.WriteByte(' ')
			}
			space = true
			continue
		}
		if _, ok := k.vocab[r]; !ok {
			continue
		}
		b.WriteRune(r)
		space = false
	}
	return strings.TrimRight(b.String(), " ")
}
