package api

import (
	"bytes"
	"errors"
	"mime/multipart"
	"strings"
	"testing"

	"github.com/infermesh/infermesh/node/apierr"
	"github.com/infermesh/infermesh/node/engine"
)

func formBody(fields map[string]string, file []byte) ([]byte, string) {
	var b bytes.Buffer
	mw := multipart.NewWriter(&b)
	for k, v := range fields {
		mw.WriteField(k, v)
	}
	if file != nil {
		p, _ := mw.CreateFormFile("file", "a.wav")
		p.Write(file)
	}
	mw.Close()
	return b.Bytes(), mw.FormDataContentType()
}

func TestParseTranscription(t *testing.T) {
	ok, ct := formBody(map[string]string{"model": "m", "response_format": "verbose_json", "timestamp_granularities[]": "word", "temperature": "0.2", "language": "de"}, []byte("RIFF"))
	req, err := parseTranscription(ok, ct, false)
	if err != nil || !req.Words || req.Language != "de" || req.Format != "verbose_json" || req.Temperature != 0.2 {
		t.Fatalf("good form: %+v %v", req, err)
	}
	bad := []struct {
		fields    map[string]string
		file      []byte
		translate bool
		param     string
	}{
		{map[string]string{}, []byte("x"), false, "model"},
		{map[string]string{"model": "m"}, nil, false, "file"},
		{map[string]string{"model": "m"}, []byte{}, false, "file"},
		{map[string]string{"model": "m", "response_format": "mp3"}, []byte("x"), false, "response_format"},
		{map[string]string{"model": "m", "temperature": "NaN"}, []byte("x"), false, "temperature"},
		{map[string]string{"model": "m", "temperature": "-1"}, []byte("x"), false, "temperature"},
		{map[string]string{"model": "m", "language": "EN-us"}, []byte("x"), false, "language"},
		{map[string]string{"model": "m", "language": "de"}, []byte("x"), true, "language"},
		{map[string]string{"model": "m", "timestamp_granularities[]": "word"}, []byte("x"), false, "timestamp_granularities"},
		{map[string]string{"model": "m", "stream": "true", "response_format": "srt"}, []byte("x"), false, "stream"},
		{map[string]string{"model": "m", "stream": "maybe"}, []byte("x"), false, "stream"},
		{map[string]string{"model": "m", "colour": "red"}, []byte("x"), false, "colour"},
		{map[string]string{"model": "m", "prompt": strings.Repeat("p", 5000)}, []byte("x"), false, "prompt"},
	}
	for _, c := range bad {
		body, ct := formBody(c.fields, c.file)
		_, err := parseTranscription(body, ct, c.translate)
		var ae *apierr.Error
		if !errors.As(err, &ae) || ae.Param != c.param || ae.Status != 400 {
			t.Errorf("%v: got %v, want a 400 naming %s", c.fields, err, c.param)
		}
	}
	if _, err := parseTranscription(ok, "application/json", false); err == nil {
		t.Error("JSON content type accepted")
	}
}

func TestSubtitlesNeverOverlap(t *testing.T) {
	segs := []struct{ s, e float64 }{{0, 2.5}, {2.4, 4}, {4, 3.9}, {3661.5, 3662.25}}
	var in []engine.Segment
	for i, s := range segs {
		in = append(in, engine.Segment{ID: i, Start: s.s, End: s.e, Text: " hi "})
	}
	srt := subtitles(in, false)
	want := "1\n00:00:00,000 --> 00:00:02,500\nhi\n\n2\n00:00:02,500 --> 00:00:04,000\nhi\n\n3\n00:00:04,000 --> 00:00:04,000\nhi\n\n4\n01:01:01,500 --> 01:01:02,250\nhi\n\n"
	if srt != want {
		t.Fatalf("srt:\n%s\nwant:\n%s", srt, want)
	}
	if vtt := subtitles(in[:1], true); vtt != "WEBVTT\n\n00:00:00.000 --> 00:00:02.500\nhi\n\n" {
		t.Fatalf("vtt: %q", vtt)
	}
}

// FuzzParseAudioForm feeds arbitrary multipart bodies to the audio form
// parser: it must never panic and never accept a file over the limit.
func FuzzParseAudioForm(f *testing.F) {
	body, ct := formBody(map[string]string{"model": "m", "language": "en"}, []byte("RIFF....WAVE"))
	f.Add(body, strings.TrimPrefix(ct, "multipart/form-data; boundary="))
	f.Add([]byte("--x\r\nContent-Disposition: form-data; name=\"file\"\r\n\r\nabc\r\n--x--\r\n"), "x")
	f.Add([]byte("--x\r\n\r\n--x--"), "x")
	f.Fuzz(func(t *testing.T, body []byte, boundary string) {
		form, err := parseAudioForm(body, "multipart/form-data; boundary="+boundary, "file")
		if err == nil && len(form.file) > MaxAudioFileBytes {
			t.Fatalf("file of %d bytes accepted", len(form.file))
		}
		parseTranscription(body, "multipart/form-data; boundary="+boundary, false)
	})
}
