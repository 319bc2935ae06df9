package engine

import (
	"context"
	"image"
)

// Image operations of POST /v1/images/generations (spec: Image
// generation). OpGenerate ("") is plain text to image.
const (
	OpGenerate         = ""
	OpImg2Img          = "img2img"
	OpInpaint          = "inpaint"
	OpOutpaint         = "outpaint"
	OpVariations       = "variations"
	OpUpscale          = "upscale"
	OpRemoveBackground = "remove-background"
	OpEdit             = "edit"
	OpLayers           = "layers"
)

// ControlNet guidance kinds (control_type).
const (
	ControlCanny = "canny"
	ControlDepth = "depth"
)

// Ranges of the image job fields the engines check (the API layer checks
// them too, so a bad request is refused before the engine is loaded).
const (
	// MaxOutpaintPercent bounds outpaint_percent: each side grows by at
	// most this share of the image's size on that axis (100 = the canvas
	// becomes up to 3 times as wide and as high). Its range is (0, 100].
	MaxOutpaintPercent = 100
	// DefaultOutpaintPercent is the growth per side without outpaint_percent.
	DefaultOutpaintPercent = 25
	// MaxControlScale bounds control_scale, the ControlNet residuals'
	// weight: 0 turns the guidance off, 1 is the trained strength, up to 2
	// exaggerates it. Range [0, 2], default 1.
	MaxControlScale = 2
	// MaxLayerCount bounds layer_count (default 2: background and
	// foreground).
	MaxLayerCount = 8
	// DefaultStrength is how much img2img and variations change without
	// strength.
	DefaultStrength = 0.75
)

// ImageJob is one local image generation or editing request: text to
// image (Operation ""), or one of the Op* operations on Image. The API
// layer has checked the ranges; an engine still answers InputErrors naming
// the field for what only it can judge (a mask of another size than the
// image, an operation it cannot do).
type ImageJob struct {
	// Operation is one of the Op* constants.
	Operation string
	// Prompt describes the result (the instruction, for OpEdit); it may be
	// empty for variations, remove-background and layers.
	Prompt string
	// NegativePrompt is what classifier-free guidance steers away from
	// ("": the empty prompt).
	NegativePrompt string
	// N is how many images to make (1-4).
	N int
	// Width and Height are the output size in pixels (64-4096); engines
	// round them to their multiple (see ImageOperator.SizeMultiple). Zero
	// for an operation on Image takes the image's size.
	Width, Height int
	// Seed makes the result repeatable bit for bit on the same node; nil
	// picks one at random.
	Seed *int64
	// Image is the source picture of every operation but text to image.
	Image image.Image
	// Mask, for OpInpaint, has Image's size; white (luma >= 50%) is
	// repainted, black kept.
	Mask image.Image
	// Strength (0-1, nil: DefaultStrength) is how much img2img, variations
	// and inpaint change.
	Strength *float64
	// OutpaintPercent (0-MaxOutpaintPercent, 0: the default) is how far
	// OpOutpaint extends each side, in percent of the image's size.
	OutpaintPercent float64
	// ControlType is ControlCanny, ControlDepth or "" (no ControlNet).
	ControlType string
	// ControlImage is the guidance picture (nil: Image, else an error).
	ControlImage image.Image
	// ControlScale (0-MaxControlScale, nil: 1) weighs the ControlNet.
	ControlScale *float64
	// ReferenceImages are further pictures for OpEdit on models that take
	// them.
	ReferenceImages []image.Image
	// LayerCount is how many RGBA layers OpLayers returns (2 when 0).
	LayerCount int
	// SafetyCheck runs the model's safety checker and drops the images it
	// flags.
	SafetyCheck bool
	// Steps overrides the model's number of denoising steps (0: the
	// model's default).
	Steps int
	// GuidanceScale overrides the model's classifier-free guidance (nil:
	// the model's default; <= 1 turns guidance off).
	GuidanceScale *float64
	// ImageGuidanceScale overrides the InstructPix2Pix image guidance of
	// OpEdit (nil: the model's default).
	ImageGuidanceScale *float64
	// Segmenter is a background remover (ISNet) for OpRemoveBackground and
	// OpLayers, set by the node when the engine has none of its own.
	Segmenter BackgroundRemover
}

// ImageJobResult is what an ImageOperator returns.
type ImageJobResult struct {
	// Images are the results in order (without the ones the safety
	// checker flagged). Layers are returned bottom first.
	Images []*image.NRGBA
	// Filtered is how many images the safety checker dropped.
	Filtered int
	// Seed is the seed used (the given one, or the one picked).
	Seed int64
}

// ImageOperator is implemented by local image generation engines (Task
// TaskImageGeneration) that run the image operations themselves. Engines
// that are also ImageGenerators serve plain text-to-image through either.
type ImageOperator interface {
	Engine
	// Supports returns nil when the engine can run operation (with
	// ControlNet guidance controlType, "" for none), else an InputError
	// whose Msg gives the reason and whose Param names the field that asks
	// for it.
	Supports(operation, controlType string, safetyCheck bool) error
	// SizeMultiple is the multiple the output sides are rounded to.
	SizeMultiple() int
	// DefaultSteps is the number of denoising steps a job without Steps
	// runs (the node estimates a request's work with it).
	DefaultSteps() int
	// RunImages runs job. Caller errors are InputErrors naming the field; a
	// cancelled ctx stops between denoising steps (and inside a run) and
	// returns ctx.Err().
	RunImages(ctx context.Context, job ImageJob) (ImageJobResult, error)
}
