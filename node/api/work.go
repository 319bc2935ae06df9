package api

import (
	"fmt"
	"image"
	"math"
	"net/http"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/infermesh/infermesh/node/apierr"
	"github.com/infermesh/infermesh/node/imagecodec"
)

// Work limits: what one request may ask of this node, estimated from the
// request itself before any work starts (issue 30, "cost bounded by what
// a request asks"). Each kind of work has a per-request limit, checked
// alone (over it: 400 work_limit_exceeded, the request is larger than this
// node ever serves), and a per-caller share: the work one key (a keyless
// remote caller: one client address) may have admitted on this node at
// once (over it: 429 work_share_exceeded with Retry-After, the caller's
// own earlier requests are still running). The local operator has no
// share limit. Both answers name the limit and its flag.
//
// The estimates:
//   - images (generation, edits, upscaling): pixels × steps × n, in
//     megapixel-steps (one megapixel is 1024×1024 = 1,048,576 pixels);
//     steps are the request's num_inference_steps, else the model's
//     default; an upscale counts its output pixels at one step. Each
//     picture asked for or sent is also bounded in pixels, an input
//     image from its header before it is decoded (and an upscale's input
//     so that the result's sides stay within 4096);
//   - speech (speech and voice cloning): characters ÷ speed, so a slow
//     voice counts for the longer audio it makes;
//   - transcription: seconds of audio.

// Defaults of WorkLimits.
const (
	// DefaultImagePixels is the largest picture: 2048×2048.
	DefaultImagePixels = 2048 * 2048
	// DefaultImageWork is the most megapixel-steps one image request may
	// ask: 1024×1024 × 4 images × 64 steps, or 2048×2048 × 64 steps.
	DefaultImageWork = 256
	// DefaultKeyImageWork is the image work one caller may have admitted at
	// once: two of the largest requests.
	DefaultKeyImageWork = 2 * DefaultImageWork
	// DefaultSpeechWork is the most characters ÷ speed one speech request
	// may ask: OpenAI's 4096 characters at speed 0.5 or faster.
	DefaultSpeechWork = 8192
	// DefaultKeySpeechWork is the speech work one caller may have admitted
	// at once.
	DefaultKeySpeechWork = 4 * 4096
	// DefaultAudioSeconds is the longest audio one transcription may carry
	// (MaxAudioSeconds, 30 minutes).
	DefaultAudioSeconds = MaxAudioSeconds
	// DefaultKeyAudioSeconds is the audio one caller may have admitted for
	// transcription at once.
	DefaultKeyAudioSeconds = 2 * MaxAudioSeconds
)

// megapixel is the pixel count of one megapixel-step unit.
const megapixel = 1 << 20

// WorkLimits bounds the work one request may ask (per-request fields,
// 400 beyond them) and the work one caller may have admitted at once on
// this node (Key fields, 429 beyond them; 0 means no share limit). Zero
// per-request fields take the defaults.
type WorkLimits struct {
	// ImagePixels is the largest picture one image request may ask for
	// or send (width × height).
	ImagePixels int64
	// ImageWork is the most megapixel-steps (pixels × steps × n, one
	// megapixel = 1024×1024) one image request may ask.
	ImageWork int64
	// KeyImageWork is the image work, in megapixel-steps, one caller may
	// have admitted at once.
	KeyImageWork int64
	// SpeechWork is the most characters ÷ speed one speech request may
	// ask.
	SpeechWork int64
	// KeySpeechWork is the speech work one caller may have admitted at
	// once.
	KeySpeechWork int64
	// AudioSeconds is the longest audio one transcription may carry (at
	// most MaxAudioSeconds).
	AudioSeconds int64
	// KeyAudioSeconds is the seconds of audio one caller may have admitted
	// for transcription at once.
	KeyAudioSeconds int64
}

// DefaultWorkLimits returns the default limits.
func DefaultWorkLimits() WorkLimits {
	return WorkLimits{
		ImagePixels: DefaultImagePixels, ImageWork: DefaultImageWork, KeyImageWork: DefaultKeyImageWork,
		SpeechWork: DefaultSpeechWork, KeySpeechWork: DefaultKeySpeechWork,
		AudioSeconds: DefaultAudioSeconds, KeyAudioSeconds: DefaultKeyAudioSeconds,
	}
}

func (l WorkLimits) withDefaults() WorkLimits {
	d := DefaultWorkLimits()
	if l.ImagePixels <= 0 {
		l.ImagePixels = d.ImagePixels
	}
	if l.ImageWork <= 0 {
		l.ImageWork = d.ImageWork
	}
	if l.SpeechWork <= 0 {
		l.SpeechWork = d.SpeechWork
	}
	if l.AudioSeconds <= 0 {
		l.AudioSeconds = d.AudioSeconds
	}
	l.AudioSeconds = min(l.AudioSeconds, MaxAudioSeconds)
	return l
}

// Validate returns every problem with the limits (flag names as in
// `infermesh serve`).
func (l WorkLimits) Validate() []error {
	var errs []error
	for _, f := range []struct {
		name   string
		v, max int64
		key    bool
	}{
		{"image-max-pixels", l.ImagePixels, 1 << 30, false},
		{"image-max-work", l.ImageWork, 1 << 40, false},
		{"image-key-work", l.KeyImageWork, 1 << 40, true},
		{"speech-max-work", l.SpeechWork, 1 << 40, false},
		{"speech-key-work", l.KeySpeechWork, 1 << 40, true},
		{"audio-max-seconds", l.AudioSeconds, MaxAudioSeconds, false},
		{"audio-key-seconds", l.KeyAudioSeconds, 1 << 40, true},
	} {
		lo := int64(1)
		if f.key {
			lo = 0
		}
		if f.v < lo || f.v > f.max {
			errs = append(errs, fmt.Errorf("--%s %d: want %d..%d", f.name, f.v, lo, f.max))
		}
	}
	return errs
}

// workKind is one kind of metered work.
type workKind int

const (
	workImage workKind = iota
	workSpeech
	workAudio
	workKinds
)

// workLimitInfo names a kind's limits and unit for refusals.
var workLimitInfo = [workKinds]struct {
	unit, maxFlag, keyFlag string
}{
	workImage:  {"megapixel-steps of image work", "--image-max-work, SERVICE_IMAGE_MAX_WORK", "--image-key-work, SERVICE_IMAGE_KEY_WORK"},
	workSpeech: {"characters ÷ speed of speech", "--speech-max-work, SERVICE_SPEECH_MAX_WORK", "--speech-key-work, SERVICE_SPEECH_KEY_WORK"},
	workAudio:  {"seconds of audio", "--audio-max-seconds, SERVICE_AUDIO_MAX_SECONDS", "--audio-key-seconds, SERVICE_AUDIO_KEY_SECONDS"},
}

// workMeter holds the work each caller has admitted on this node, by
// kind. One per Server.
type workMeter struct {
	lim WorkLimits
	mu  sync.Mutex
	use [workKinds]map[string]int64
}

func newWorkMeter(l WorkLimits) *workMeter {
	m := &workMeter{lim: l.withDefaults()}
	for k := range m.use {
		m.use[k] = map[string]int64{}
	}
	return m
}

// limits returns the per-request and per-caller limits of kind.
func (m *workMeter) limits(k workKind) (perRequest, perKey int64) {
	switch k {
	case workImage:
		return m.lim.ImageWork, m.lim.KeyImageWork
	case workSpeech:
		return m.lim.SpeechWork, m.lim.KeySpeechWork
	default:
		return m.lim.AudioSeconds, m.lim.KeyAudioSeconds
	}
}

// tooMuch is the 400 for a request whose estimate alone passes the
// per-request limit; what describes the request (e.g. "4096x4096 × 4
// images × 200 steps").
func (m *workMeter) tooMuch(k workKind, param string, units int64, what string) *apierr.Error {
	perRequest, _ := m.limits(k)
	info := workLimitInfo[k]
	return apierr.BadRequest(apierr.CodeWorkLimit, param, fmt.Sprintf(
		"This request asks for %d %s (%s); this node serves at most %d per request (%s). Ask for less.",
		units, info.unit, what, perRequest, info.maxFlag))
}

// admit checks units of kind against the per-request limit and, for a
// caller with a share (caller != ""), reserves them within the caller's
// share. It returns the release, to be called once the work is done.
func (m *workMeter) admit(k workKind, caller, param string, units int64, what string) (func(), *apierr.Error) {
	perRequest, perKey := m.limits(k)
	if units > perRequest {
		return nil, m.tooMuch(k, param, units, what)
	}
	info := workLimitInfo[k]
	if perKey > 0 && units > perKey {
		return nil, apierr.BadRequest(apierr.CodeWorkLimit, param, fmt.Sprintf(
			"This request asks for %d %s (%s); a caller may have at most %d admitted at once on this node (%s). Ask for less.",
			units, info.unit, what, perKey, info.keyFlag))
	}
	if caller == "" || perKey == 0 {
		return func() {}, nil
	}
	m.mu.Lock()
	inUse := m.use[k][caller]
	if inUse+units > perKey {
		m.mu.Unlock()
		e := apierr.New(http.StatusTooManyRequests, apierr.TypeRateLimit, apierr.CodeWorkShare, param, fmt.Sprintf(
			"This request asks for %d %s; your requests already running on this node hold %d of your share of %d (%s). Retry when they finish.",
			units, info.unit, inUse, perKey, info.keyFlag))
		e.RetryAfter = 1
		return nil, e
	}
	m.use[k][caller] = inUse + units
	m.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			m.mu.Lock()
			defer m.mu.Unlock()
			if left := m.use[k][caller] - units; left > 0 {
				m.use[k][caller] = left
			} else {
				delete(m.use[k], caller)
			}
		})
	}, nil
}

// WorkCaller names who a request's work counts against: "" for a caller
// without a share (the local operator), else one name per key (or per
// client address for a keyless remote caller). Options.WorkCaller.
type WorkCaller func(r *http.Request) string

// workCaller returns the share the request counts against.
func (s *Server) workCaller(r *http.Request) string {
	if s.opt.WorkCaller == nil {
		return ""
	}
	return s.opt.WorkCaller(r)
}

// admitWork is workMeter.admit for the request's caller; it writes the
// refusal and returns ok false.
func (s *Server) admitWork(w http.ResponseWriter, r *http.Request, k workKind, param string, units int64, what string) (release func(), ok bool) {
	release, err := s.work.admit(k, s.workCaller(r), param, units, what)
	if err != nil {
		apierr.Write(w, err)
		return nil, false
	}
	return release, true
}

// imageWork is the estimate of n pictures of w×h pixels at steps steps,
// in megapixel-steps, rounded up.
func imageWork(w, h, steps, n int) int64 {
	px := float64(w) * float64(h) * float64(max(steps, 1)) * float64(max(n, 1))
	return int64(math.Ceil(px / megapixel))
}

// speechWork is the estimate of chars characters spoken at speed (0: 1).
func speechWork(chars int, speed float32) int64 {
	if !(speed > 0) {
		speed = 1
	}
	return int64(math.Ceil(float64(chars) / float64(speed)))
}

// imageAsk is the picture size an image request asks for (0: the size of
// its input picture).
type imageAsk struct{ w, h int }

// picturePixels is the 400 for a picture over ImagePixels; what names it
// ("'size' 4096x4096", "The image").
func (s *Server) picturePixels(param, what string, w, h int) *apierr.Error {
	return apierr.BadRequest(apierr.CodeWorkLimit, param, fmt.Sprintf(
		"%s is %dx%d = %d pixels; this node takes pictures of at most %d pixels (--image-max-pixels, SERVICE_IMAGE_MAX_PIXELS).",
		what, w, h, int64(w)*int64(h), s.work.lim.ImagePixels))
}

// admitImageWork checks an image request that makes n pictures of w×h
// pixels at steps denoising steps against the picture and work limits
// and reserves its work in the caller's share; param names the field the
// size comes from. It writes the refusal and returns ok false.
func (s *Server) admitImageWork(w http.ResponseWriter, r *http.Request, param string, pw, ph, steps, n int) (release func(), ok bool) {
	if int64(pw)*int64(ph) > s.work.lim.ImagePixels {
		what := "The result"
		if param == "size" {
			what = "'size'"
		}
		apierr.Write(w, s.picturePixels(param, what, pw, ph))
		return nil, false
	}
	n, steps = max(n, 1), max(steps, 1)
	what := fmt.Sprintf("%dx%d × %d image(s) × %d step(s)", pw, ph, n, steps)
	return s.admitWork(w, r, workImage, param, imageWork(pw, ph, steps, n), what)
}

// decodeImagePicture decodes a picture of an image request (field names
// it) under the node's image budget, refusing from its header, before
// any pixel is decoded, a picture over ImagePixels or one whose sides
// times factor (an upscale's) pass maxImageSide.
func (s *Server) decodeImagePicture(r *http.Request, field, b64 string, factor int) (image.Image, func(), error) {
	check := func(w, h int) error {
		if int64(w)*int64(h) > s.work.lim.ImagePixels {
			return s.picturePixels(field, "The "+strings.ReplaceAll(field, "_", " "), w, h)
		}
		if w*factor > maxImageSide || h*factor > maxImageSide {
			msg := fmt.Sprintf("The %s is %dx%d pixels; each side must be at most %d.", strings.ReplaceAll(field, "_", " "), w, h, maxImageSide)
			if factor > 1 {
				msg = fmt.Sprintf("The %s is %dx%d pixels; upscaled %dx it would pass %d pixels per side.", field, w, h, factor, maxImageSide)
			}
			return apierr.BadRequest(apierr.CodeInvalidValue, field, msg)
		}
		return nil
	}
	return imagecodec.DecodeBudgeted(r.Context(), b64, imagecodec.Options{MaxBytes: MaxImageBytes, Check: check}, s.images)
}

// admitSpeechWork checks and reserves the work of speaking input at
// speed (nil: 1). It writes the refusal and returns ok false.
func (s *Server) admitSpeechWork(w http.ResponseWriter, r *http.Request, input string, sp *float64) (release func(), ok bool) {
	chars := utf8.RuneCountInString(input)
	v := speed(sp)
	return s.admitWork(w, r, workSpeech, "input", speechWork(chars, v), fmt.Sprintf("%d characters at speed %g", chars, v))
}
