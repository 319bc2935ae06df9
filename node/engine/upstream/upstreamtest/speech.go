package upstreamtest

import (
	"encoding/binary"
	"math"
	"net/http"
	"strings"

	"github.com/infermesh/infermesh/node/apierr"
)

// SpeechRate is the sample rate of the double's speech (OpenAI's pcm
// format: mono signed 16-bit little-endian).
const SpeechRate = 24000

// SpeechWordSeconds is how long the double speaks each word of the input.
const SpeechWordSeconds = 0.25

// SpeechHz is the pitch of the tone the double speaks for a voice: 220 Hz
// for "alloy" (and any other), 330 Hz for "nova".
func SpeechHz(voice string) float64 {
	if voice == "nova" {
		return 330
	}
	return 220
}

// speech answers /v1/audio/speech with a tone of SpeechHz(voice) lasting
// SpeechWordSeconds per word (scaled by 1/speed), flushed word by word.
// Only response_format "pcm" is served (400 for others); voice "nobody" is
// refused with a 400; model "cut-off" breaks off after the first word.
func (d *Provider) speech(w http.ResponseWriter, r *http.Request) {
	body, ok := d.read(w, r)
	if !ok {
		return
	}
	input, _ := body["input"].(string)
	voice, _ := body["voice"].(string)
	switch {
	case strings.TrimSpace(input) == "":
		writeErr(w, 400, "input is required", apierr.TypeInvalidRequest, "input", apierr.CodeMissingParam)
		return
	case voice == "" || voice == "nobody":
		writeErr(w, 400, "unknown voice", apierr.TypeInvalidRequest, "voice", apierr.CodeInvalidValue)
		return
	case body["response_format"] != "pcm":
		writeErr(w, 400, "this double speaks pcm only", apierr.TypeInvalidRequest, "response_format", apierr.CodeInvalidValue)
		return
	}
	speed := 1.0
	if v, ok := body["speed"].(float64); ok && v > 0 {
		speed = v
	}
	w.Header().Set("Content-Type", "audio/pcm")
	rc := http.NewResponseController(w)
	hz := SpeechHz(voice)
	n := int(SpeechWordSeconds * SpeechRate / speed)
	t := 0
	for i := range strings.Fields(input) {
		if i == 1 && body["model"] == "cut-off" {
			panic(http.ErrAbortHandler)
		}
		word := make([]byte, 2*n)
		for k := range n {
			v := 0.5 * math.Sin(2*math.Pi*hz*float64(t)/SpeechRate)
			binary.LittleEndian.PutUint16(word[2*k:], uint16(int16(v*32767)))
			t++
		}
		w.Write(word)
		rc.Flush()
	}
}
