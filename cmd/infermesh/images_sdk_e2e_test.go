package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"image"
	"image/color"
	"image/png"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/infermesh/infermesh/node/engine/onnx/onnxtest"
)

// OpenAI's image edit and variation calls, made with the official Go SDK
// (multipart forms) into a node without models, forwarded to the one
// that holds the generated diffusion pipeline. Loopback prefix
// 127.0.93.x is this file's.

// sdkPNG is a form file the SDK uploads with a name and content type.
type sdkPNG struct {
	io.Reader
	name string
}

func (f sdkPNG) Filename() string    { return f.name }
func (f sdkPNG) ContentType() string { return "image/png" }

func sdkPNGOf(t *testing.T, name string, img image.Image) sdkPNG {
	t.Helper()
	var buf bytes.Buffer
	if err := png.Encode(&buf, img); err != nil {
		t.Fatal(err)
	}
	return sdkPNG{&buf, name}
}

// sdkImages decodes an SDK images answer's PNGs.
func sdkImages(t *testing.T, res *openai.ImagesResponse) []*image.NRGBA {
	t.Helper()
	var out []*image.NRGBA
	for _, d := range res.Data {
		raw, err := base64.StdEncoding.DecodeString(d.B64JSON)
		if err != nil {
			t.Fatal(err)
		}
		img, err := png.Decode(bytes.NewReader(raw))
		if err != nil {
			t.Fatalf("not a PNG: %v", err)
		}
		out = append(out, opsNRGBA(img))
	}
	return out
}

func TestImagesSDKEditAndVariation(t *testing.T) {
	dirs := []string{onnxtest.AssetDir(t, "tiny-sd", "manifest.json"), onnxtest.AssetDir(t, "tiny-sd-pix2pix", "manifest.json")}
	holder := startOpsNode(t, "imgsdk-a", "127.0.93.1", dirs, "")
	entry := startOpsNode(t, "imgsdk-b", "127.0.93.2", nil, "127.0.93.1:17946")
	waitMembers(t, []*proc{holder, entry}, 2)
	ctx := context.Background()
	c := entry.client()
	eventually(t, 30*time.Second, "the entry node sees the holder's models", func() error {
		_, err := c.Models.Get(ctx, opsSD)
		return err
	})

	photo := opsBoxDown(opsPhoto(t, image.Rect(128, 40, 384, 296)), 2) // 128x128, the face
	hole := image.Rect(40, 40, 88, 96)
	// OpenAI's mask: transparent where the picture is repainted.
	mask := opsSolid(128, 128, color.NRGBA{A: 0xff})
	for y := hole.Min.Y; y < hole.Max.Y; y++ {
		for x := hole.Min.X; x < hole.Max.X; x++ {
			mask.SetNRGBA(x, y, color.NRGBA{})
		}
	}

	t.Run("edit with a mask", func(t *testing.T) {
		var resp *http.Response
		params := openai.ImageEditParams{
			Image:  openai.ImageEditParamsImageUnion{OfFile: sdkPNGOf(t, "face.png", photo)},
			Mask:   sdkPNGOf(t, "mask.png", mask),
			Prompt: "a red hat", Model: opsSD, N: openai.Int(2), Size: "128x128",
		}
		params.SetExtraFields(map[string]any{"seed": 5}) // a local pipeline's own field
		res, err := c.Images.Edit(ctx, params, option.WithResponseInto(&resp))
		if err != nil {
			t.Fatal(err)
		}
		if b := resp.Header.Get("X-Service-Backend"); b != "imgsdk-a" {
			t.Errorf("served by %q, want the holder imgsdk-a", b)
		}
		imgs := sdkImages(t, res)
		if len(imgs) != 2 {
			t.Fatalf("%d images, want 2", len(imgs))
		}
		for i, im := range imgs {
			if im.Rect.Dx() != 128 || im.Rect.Dy() != 128 {
				t.Fatalf("image %d is %v, want 128x128", i, im.Rect)
			}
			maxOut, _ := opsDiff(im, photo, func(x, y int) bool { return !image.Pt(x, y).In(hole) })
			_, meanIn := opsDiff(im, photo, func(x, y int) bool { return image.Pt(x, y).In(hole) })
			t.Logf("edit %d: outside the mask max |diff| %d; inside mean %.1f", i, maxOut, meanIn)
			if maxOut > 2 || meanIn < 5 {
				t.Errorf("edit %d: outside max |diff| %d (want <= 2), inside mean %.1f (want >= 5)", i, maxOut, meanIn)
			}
		}
	})
	t.Run("edit by instruction", func(t *testing.T) {
		res, err := c.Images.Edit(ctx, openai.ImageEditParams{
			Image:  openai.ImageEditParamsImageUnion{OfFile: sdkPNGOf(t, "face.png", photo)},
			Prompt: "turn it into winter", Model: opsPix2Pix, Size: "64x64",
		})
		if err != nil {
			t.Fatal(err)
		}
		if imgs := sdkImages(t, res); len(imgs) != 1 || imgs[0].Rect.Dx() != 64 || imgs[0].Rect.Dy() != 64 {
			t.Fatalf("%d images", len(imgs))
		}
	})
	t.Run("variation", func(t *testing.T) {
		//lint:ignore SA1019 the SDK marks variations deprecated; the route is part of the API we serve
		res, err := c.Images.NewVariation(ctx, openai.ImageNewVariationParams{
			Image: sdkPNGOf(t, "face.png", photo), Model: opsSD, N: openai.Int(2), Size: openai.ImageNewVariationParamsSize256x256,
		})
		if err != nil {
			t.Fatal(err)
		}
		imgs := sdkImages(t, res)
		if len(imgs) != 2 || imgs[0].Rect.Dx() != 256 || imgs[0].Rect.Dy() != 256 {
			t.Fatalf("%d images", len(imgs))
		}
		if bytes.Equal(imgs[0].Pix, imgs[1].Pix) {
			t.Error("two variations are identical")
		}
	})
	t.Run("refusal", func(t *testing.T) {
		_, err := c.Images.Edit(ctx, openai.ImageEditParams{
			Image:  openai.ImageEditParamsImageUnion{OfFile: sdkPNGOf(t, "face.png", photo)},
			Prompt: "x", Model: opsSD, OutputFormat: openai.ImageEditParamsOutputFormatWebP,
		})
		var apiErr *openai.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadRequest || apiErr.Param != "output_format" {
			t.Fatalf("webp: %v; want a 400 naming output_format", err)
		}
	})
}
