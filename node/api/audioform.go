package api

import (
	"bytes"
	"errors"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"strconv"
	"strings"

	"github.com/infermesh/infermesh/node/apierr"
)

// Limits of a multipart audio form. The whole form is read from memory
// (the already-read body); nothing is written to disk.
const (
	// MaxAudioFileBytes bounds the uploaded audio file (OpenAI's 25 MB).
	MaxAudioFileBytes = 25 << 20
	maxFormParts      = 32
	maxFormField      = 8 << 10
)

// audioForm is a parsed multipart/form-data audio request.
type audioForm struct {
	fields map[string][]string
	file   []byte
	// fileName and fileType are the file part's name and Content-Type.
	fileName, fileType string
	hasFile            bool
}

func (f *audioForm) value(name string) string {
	if v := f.fields[name]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// multipartBoundary returns the boundary of a multipart/form-data request,
// or a 400 naming what is wrong.
func multipartBoundary(contentType string) (string, error) {
	ct, params, err := mime.ParseMediaType(contentType)
	if err != nil || ct != "multipart/form-data" {
		return "", apierr.BadRequest(apierr.CodeInvalidValue, "", "This endpoint takes multipart/form-data (Content-Type: multipart/form-data; boundary=...).")
	}
	b := params["boundary"]
	if b == "" || len(b) > 70 {
		return "", apierr.BadRequest(apierr.CodeInvalidValue, "", "The multipart/form-data Content-Type has no valid boundary.")
	}
	return b, nil
}

// parseAudioForm reads a multipart form from body: text fields of at most
// 8 KiB each and one part named fileField of at most MaxAudioFileBytes.
// Unknown fields are refused by the route's own validation.
func parseAudioForm(body []byte, contentType, fileField string) (*audioForm, error) {
	boundary, err := multipartBoundary(contentType)
	if err != nil {
		return nil, err
	}
	mr := multipart.NewReader(bytes.NewReader(body), boundary)
	f := &audioForm{fields: map[string][]string{}}
	for n := 0; ; n++ {
		p, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, apierr.BadRequest(apierr.CodeInvalidValue, "", "Could not parse the multipart form: "+err.Error())
		}
		if n >= maxFormParts {
			return nil, apierr.BadRequest(apierr.CodeInvalidValue, "", "The form has too many parts.")
		}
		name := p.FormName()
		if name == "" {
			return nil, apierr.BadRequest(apierr.CodeInvalidValue, "", "A form part has no name.")
		}
		if name == fileField {
			if f.hasFile {
				return nil, apierr.BadRequest(apierr.CodeInvalidValue, fileField, "Send one "+fileField+".")
			}
			data, err := io.ReadAll(io.LimitReader(p, MaxAudioFileBytes+1))
			if err != nil {
				return nil, apierr.BadRequest(apierr.CodeInvalidValue, fileField, "Could not read the "+fileField+" part.")
			}
			if len(data) > MaxAudioFileBytes {
				return nil, apierr.New(http.StatusRequestEntityTooLarge, apierr.TypeInvalidRequest, apierr.CodeTooLarge, fileField,
					"The audio file is larger than 25 MB.")
			}
			f.file, f.hasFile = data, true
			f.fileName, f.fileType = p.FileName(), p.Header.Get("Content-Type")
			continue
		}
		v, err := io.ReadAll(io.LimitReader(p, maxFormField+1))
		if err != nil || len(v) > maxFormField {
			return nil, apierr.BadRequest(apierr.CodeInvalidValue, name, "The "+name+" field is longer than 8 KiB.")
		}
		f.fields[name] = append(f.fields[name], string(v))
	}
	return f, nil
}

// peekForm finds the model and stream flag of a multipart request for
// routing, skipping every other part; the serving node parses the form in
// full.
func peekForm(body []byte, contentType string) (model string, stream bool) {
	boundary, err := multipartBoundary(contentType)
	if err != nil {
		return "", false
	}
	mr := multipart.NewReader(bytes.NewReader(body), boundary)
	for n := 0; n < maxFormParts; n++ {
		p, err := mr.NextPart()
		if err != nil {
			break
		}
		switch p.FormName() {
		case "model", "stream":
			v, err := io.ReadAll(io.LimitReader(p, 1024))
			if err != nil {
				return "", false
			}
			if p.FormName() == "model" {
				model = strings.TrimSpace(string(v))
			} else {
				stream, _ = strconv.ParseBool(strings.TrimSpace(string(v)))
			}
		}
	}
	return model, stream
}
