package api

import (
	"errors"
	"testing"

	"github.com/infermesh/infermesh/node/apierr"
)

func TestParseDetections(t *testing.T) {
	bad := []struct {
		body  string
		faces bool
		param string
	}{
		{`{"image":5}`, false, "image"},
		{`{}`, false, "image"},
		{`{"image":"x","confidence_threshold":-0.1}`, false, "confidence_threshold"},
		{`{"image":"x","confidence_threshold":"high"}`, false, "confidence_threshold"},
		{`{"image":"x","max_results":0}`, false, "max_results"},
		{`{"image":"x","max_results":1001}`, true, "max_results"},
		{`{"image":"x","return_embeddings":true}`, false, "return_embeddings"},
		{`{"image":"x","return_embeddings":"yes"}`, true, "return_embeddings"},
		{`{"image":"x","colour":1}`, true, "colour"},
	}
	for _, c := range bad {
		_, err := parseDetections(c.faces)([]byte(c.body))
		var ae *apierr.Error
		if !errors.As(err, &ae) || ae.Status != 400 || ae.Param != c.param {
			t.Errorf("%s: %v, want a 400 naming %s", c.body, err, c.param)
		}
	}
	req, err := parseDetections(true)([]byte(`{"image":"x","confidence_threshold":0.25,"max_results":3,"return_embeddings":true}`))
	if err != nil || *req.ConfidenceThreshold != 0.25 || *req.MaxResults != 3 || !req.ReturnEmbeddings {
		t.Fatalf("good body: %+v %v", req, err)
	}
}

// FuzzParseDetections: no body may panic the vision request parser.
func FuzzParseDetections(f *testing.F) {
	f.Add([]byte(`{"image":"data:image/png;base64,AAAA","confidence_threshold":0.5,"max_results":10}`), true)
	f.Add([]byte(`{"model":"m","image":"x","return_embeddings":true}`), false)
	f.Fuzz(func(t *testing.T, body []byte, faces bool) {
		req, err := parseDetections(faces)(body)
		if err == nil && (req.Image == "" || req.MaxResults != nil && (*req.MaxResults < 1 || *req.MaxResults > 1000)) {
			t.Fatalf("accepted %q as %+v", body, req)
		}
	})
}
