package onnxtest

import (
	"image"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// GoTestdata reads a file from the Go distribution's image/testdata, which
// holds real photographs (video-001.png, video-001.jpeg, ...).
func GoTestdata(t testing.TB, name string) []byte {
	t.Helper()
	goroot, err := exec.Command("go", "env", "GOROOT").Output()
	if err != nil {
		t.Fatalf("go env GOROOT: %v", err)
	}
	data, err := os.ReadFile(filepath.Join(strings.TrimSpace(string(goroot)), "src", "image", "testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// PhotoRegions returns fixed regions of Go's image/testdata/video-001.png
// (150x103: two presenters in front of a warm wall, a lectern between them),
// chosen by looking at the photo and at ISNet's mask: wall only (between
// the heads, the top-left corner), and inside the presenters (left face, left
// torso, right face, right torso). A background remover must make the first
// transparent and keep the second opaque.
func PhotoRegions() (background, foreground []image.Rectangle) {
	background = []image.Rectangle{
		image.Rect(55, 0, 95, 50),
		image.Rect(0, 0, 12, 40),
	}
	foreground = []image.Rectangle{
		image.Rect(22, 20, 32, 38),
		image.Rect(12, 55, 28, 100),
		image.Rect(118, 18, 132, 38),
		image.Rect(115, 50, 140, 100),
	}
	return background, foreground
}
