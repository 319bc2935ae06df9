package vision

import "testing"

// The kernel benchmarks time the pixel kernels alone on a 640x480 image,
// as the pipelines call them: BlazeFace's letterbox (the 640x640 square
// around the image to 256x256), CenterNet's stretch to 512x512, and a
// FaceRes crop (200 px face, 2x2 samples a pixel).

func BenchmarkKernelLetterbox256(b *testing.B) {
	src := testPattern(640, 480)
	dst := make([]float32, 256*256*3)
	for b.Loop() {
		resampleWindow(src, 0, -80, 640, 640, 256, 256, dst, 1/127.5, -1)
	}
}

func BenchmarkKernelResize512(b *testing.B) {
	src := testPattern(640, 480)
	dst := make([]float32, 512*512*3)
	for b.Loop() {
		resampleWindow(src, 0, 0, 640, 480, 512, 512, dst, 1, 0)
	}
}

func BenchmarkKernelCrop112(b *testing.B) {
	src := testPattern(640, 480)
	dst := make([]float32, faceResSize*faceResSize*3)
	for b.Loop() {
		rotatedCrop(src, 320, 240, 200, 0.05, faceResSize, dst, 1, 0)
	}
}
