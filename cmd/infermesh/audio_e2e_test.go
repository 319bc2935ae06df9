package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"io"
	"mime/multipart"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

const librivox = "/usr/share/pocketsphinx/test/data/librivox"

// librivoxClips returns the clips of Debian's pocketsphinx-testdata with
// their reference transcripts.
func librivoxClips(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(librivox, "transcription"))
	if err != nil {
		t.Fatalf("LibriVox transcripts (Debian package pocketsphinx-testdata): %v", err)
	}
	re := regexp.MustCompile(`^<s> (.*) </s> \((.*)\)$`)
	out := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if m := re.FindStringSubmatch(l); m != nil {
			out[m[2]] = m[1]
		}
	}
	if len(out) != 5 {
		t.Fatalf("want 5 LibriVox clips, found %d", len(out))
	}
	return out
}

func normWords(s string) []string {
	s = strings.ToLower(s)
	s = regexp.MustCompile(`[^a-z0-9' ]+`).ReplaceAllString(s, " ")
	return strings.Fields(s)
}

// wordErrors is the word-level edit distance between ref and hyp.
func wordErrors(ref, hyp []string) int {
	prev := make([]int, len(hyp)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(ref); i++ {
		cur := make([]int, len(hyp)+1)
		cur[0] = i
		for j := 1; j <= len(hyp); j++ {
			sub := prev[j-1]
			if ref[i-1] != hyp[j-1] {
				sub++
			}
			cur[j] = min(sub, prev[j]+1, cur[j-1]+1)
		}
		prev = cur
	}
	return prev[len(hyp)]
}

var cueLine = regexp.MustCompile(`^(\d\d):(\d\d):(\d\d)[,.](\d\d\d) --> (\d\d):(\d\d):(\d\d)[,.](\d\d\d)$`)

// parseCues reads the cue times of an srt or vtt document in order.
func parseCues(t *testing.T, doc string) [][2]float64 {
	var cues [][2]float64
	for _, l := range strings.Split(doc, "\n") {
		m := cueLine.FindStringSubmatch(strings.TrimSpace(l))
		if m == nil {
			continue
		}
		at := func(h, mi, s, ms string) float64 {
			a, _ := strconv.Atoi(h)
			b, _ := strconv.Atoi(mi)
			c, _ := strconv.Atoi(s)
			d, _ := strconv.Atoi(ms)
			return float64(a*3600+b*60+c) + float64(d)/1000
		}
		cues = append(cues, [2]float64{at(m[1], m[2], m[3], m[4]), at(m[5], m[6], m[7], m[8])})
	}
	return cues
}

// TestSpeechToTextThroughMesh transcribes the LibriVox clips with the
// official SDK through a node that holds no speech model.
func TestSpeechToTextThroughMesh(t *testing.T) {
	holder := startMeshNode(t, meshNode{id: "stt-a", ip: "127.0.31.1", models: []string{"whisper-base"}}, "")
	entry := startMeshNode(t, meshNode{id: "stt-b", ip: "127.0.31.2"}, "127.0.31.1:17946")
	waitMembers(t, []*proc{holder, entry}, 2)
	const model = "onnx/whisper/base"
	waitModel(t, entry, model, "onnx")
	cl := entry.client()
	ctx := context.Background()

	refs := librivoxClips(t)
	errs, words := 0, 0
	var longest []byte
	for id, ref := range refs {
		wav, err := os.ReadFile(filepath.Join(librivox, id+".wav"))
		if err != nil {
			t.Fatal(err)
		}
		if len(wav) > len(longest) {
			longest = wav
		}
		var resp *http.Response
		res, err := cl.Audio.Transcriptions.New(ctx, openai.AudioTranscriptionNewParams{File: bytes.NewReader(wav), Model: model,
			ResponseFormat: openai.AudioResponseFormatVerboseJSON}, option.WithResponseInto(&resp))
		if err != nil {
			t.Fatalf("%s: %v", id, err)
		}
		if b := resp.Header.Get("X-Service-Backend"); b != "stt-a" {
			t.Errorf("%s: X-Service-Backend %q, want stt-a", id, b)
		}
		var verbose struct {
			Language string  `json:"language"`
			Duration float64 `json:"duration"`
			Text     string  `json:"text"`
			Segments []struct {
				Start, End float64
				Text       string
			} `json:"segments"`
		}
		if err := json.Unmarshal([]byte(res.RawJSON()), &verbose); err != nil {
			t.Fatal(err)
		}
		e := wordErrors(normWords(ref), normWords(verbose.Text))
		errs, words = errs+e, words+len(normWords(ref))
		t.Logf("%s: %q (%d errors)", id, verbose.Text, e)
		if verbose.Language != "english" || len(verbose.Segments) == 0 || verbose.Duration <= 0 {
			t.Errorf("%s: language %q, %d segments, duration %.2f", id, verbose.Language, len(verbose.Segments), verbose.Duration)
		}
		for i, s := range verbose.Segments {
			if s.End < s.Start || i > 0 && s.Start < verbose.Segments[i-1].End-0.01 {
				t.Errorf("%s: segment %d [%.2f, %.2f] not monotone", id, i, s.Start, s.End)
			}
		}
	}
	wer := float64(errs) / float64(words)
	t.Logf("word error rate over the %d LibriVox clips: %.1f %% (%d/%d)", len(refs), 100*wer, errs, words)
	if wer > 0.10 {
		t.Errorf("WER %.3f > 0.10", wer)
	}

	// Subtitles parse: monotone, non-overlapping cues within the clip.
	for _, format := range []string{"srt", "vtt"} {
		body, ct := audioForm(map[string]string{"model": model, "response_format": format}, longest, "audio/wav")
		resp, err := http.Post(entry.url("/v1/audio/transcriptions"), ct, body)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		doc := string(raw)
		cues := parseCues(t, doc)
		if resp.StatusCode != 200 || len(cues) == 0 || format == "vtt" && !strings.HasPrefix(doc, "WEBVTT") {
			t.Fatalf("%s: %d, no cues in %q", format, resp.StatusCode, doc)
		}
		for i, c := range cues {
			if c[1] < c[0] || i > 0 && c[0] < cues[i-1][1] {
				t.Errorf("%s: cue %d %v overlaps or runs backwards", format, i, c)
			}
		}
	}

	// Word timestamps.
	res, err := cl.Audio.Transcriptions.New(ctx, openai.AudioTranscriptionNewParams{File: bytes.NewReader(longest), Model: model,
		ResponseFormat: openai.AudioResponseFormatVerboseJSON, TimestampGranularities: []string{"word", "segment"}})
	if err != nil {
		t.Fatal(err)
	}
	var withWords struct {
		Words []struct {
			Word       string
			Start, End float64
		} `json:"words"`
	}
	json.Unmarshal([]byte(res.RawJSON()), &withWords)
	if len(withWords.Words) < 5 {
		t.Errorf("word timestamps: %d words", len(withWords.Words))
	}

	// Streaming: deltas, then the done event with the whole text.
	stream := cl.Audio.Transcriptions.NewStreaming(ctx, openai.AudioTranscriptionNewParams{File: bytes.NewReader(longest), Model: model})
	deltas, done := 0, ""
	for stream.Next() {
		ev := stream.Current()
		switch ev.Type {
		case "transcript.text.delta":
			deltas++
		case "transcript.text.done":
			done = ev.Text
		}
	}
	if err := stream.Err(); err != nil || deltas == 0 || len(normWords(done)) < 5 {
		t.Errorf("stream: %d deltas, done %q, err %v", deltas, done, err)
	}

	// Translation of English speech stays English.
	//lint:ignore SA1019 the SDK marks translations deprecated; the route is part of the API we serve
	tr, err := cl.Audio.Translations.New(ctx, openai.AudioTranslationNewParams{File: bytes.NewReader(longest), Model: model})
	if err != nil || len(normWords(tr.Text)) < 5 {
		t.Errorf("translation: %v %+v", err, tr)
	}

	// Bad input: each a 4xx naming the field, and the node keeps serving.
	wav := func(declaredSeconds int) []byte { // a WAV header declaring that much 16 kHz mono audio
		var b bytes.Buffer
		n := uint32(declaredSeconds * 32000)
		b.WriteString("RIFF")
		binary.Write(&b, binary.LittleEndian, 36+n)
		b.WriteString("WAVEfmt ")
		for _, v := range []any{uint32(16), uint16(1), uint16(1), uint32(16000), uint32(32000), uint16(2), uint16(16)} {
			binary.Write(&b, binary.LittleEndian, v)
		}
		b.WriteString("data")
		binary.Write(&b, binary.LittleEndian, n)
		return b.Bytes()
	}
	good := map[string]string{"model": model}
	bad := []struct {
		name     string
		fields   map[string]string
		file     []byte
		fileType string
		status   int
		param    string
	}{
		{"empty file", good, []byte{}, "audio/wav", 400, "file"},
		{"truncated wav", good, longest[:30], "audio/wav", 400, "file"},
		{"zero-length audio", good, wav(0), "audio/wav", 400, "file"},
		{"2-hour declared duration", good, wav(7200), "audio/wav", 413, "file"},
		{"not audio", good, []byte("hello, this is text"), "audio/wav", 400, "file"},
		{"wrong content type", good, longest, "image/png", 400, "file"},
		{"no file", good, nil, "", 400, "file"},
		{"bad format", map[string]string{"model": model, "response_format": "mp3"}, longest, "audio/wav", 400, "response_format"},
		{"bad temperature", map[string]string{"model": model, "temperature": "3"}, longest, "audio/wav", 400, "temperature"},
		{"bad language", map[string]string{"model": model, "language": "english!"}, longest, "audio/wav", 400, "language"},
		{"unknown model", map[string]string{"model": "nope:1"}, longest, "audio/wav", 404, "model"},
		{"model of another task", map[string]string{"model": "onnx/centernet/mobilenetv3-coco"}, longest, "audio/wav", 404, "model"},
	}
	for _, c := range bad {
		body, ct := audioForm(c.fields, c.file, c.fileType)
		resp, err := http.Post(entry.url("/v1/audio/transcriptions"), ct, body)
		if err != nil {
			t.Fatal(err)
		}
		_, param := errorBody(t, resp)
		if resp.StatusCode != c.status || param != c.param {
			t.Errorf("%s: %d param %q, want %d %q", c.name, resp.StatusCode, param, c.status, c.param)
		}
	}
	resp, err := http.Post(entry.url("/v1/audio/transcriptions"), "application/json", strings.NewReader(`{"model":"x"}`))
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 400 {
		t.Errorf("JSON body: %d, want 400", resp.StatusCode)
	}
	resp.Body.Close()
	if _, err := cl.Audio.Transcriptions.New(ctx, openai.AudioTranscriptionNewParams{File: bytes.NewReader(longest), Model: model}); err != nil {
		t.Errorf("after the bad inputs: %v", err)
	}
}

// audioForm builds a multipart body with fields and, when file is not nil,
// a file part of the given content type.
func audioForm(fields map[string]string, file []byte, fileType string) (*bytes.Buffer, string) {
	var b bytes.Buffer
	mw := multipart.NewWriter(&b)
	for k, v := range fields {
		mw.WriteField(k, v)
	}
	if file != nil {
		h := map[string][]string{"Content-Disposition": {`form-data; name="file"; filename="a.wav"`}, "Content-Type": {fileType}}
		p, _ := mw.CreatePart(h)
		p.Write(file)
	}
	mw.Close()
	return &b, mw.FormDataContentType()
}
