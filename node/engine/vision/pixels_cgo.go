package vision

// The pixel kernels' hot loops are C (pixels.c): Go does not vectorise, and
// the C is compiled without contraction into fused multiply-adds or
// -ffast-math, so float32 results are IEEE-exact and match the Go
// references in the tests bit for bit. cgo's flag allowlist refuses
// -ffp-contract=off; ISO C mode (-std=c11) is GCC's way to the same (its
// default there), and pixels.c's FP_CONTRACT pragma is clang's.

/*
#cgo CFLAGS: -O3 -std=c11 -fno-fast-math
#include "pixels.h"
*/
import "C"

import (
	"image"
	"unsafe"
)

// resampleBand computes output rows [j0, j1) of resampleRows into dst
// (their (j1-j0)*dw*3 values) with the taps xt and yt, vrow a scratch row
// of at least 4*(cx1-cx0) values, the source columns [cx0, cx1) being all
// that xt reads.
func resampleBand(src *image.RGBA, cx0, cx1 int, xt, yt *filterTaps, j0, j1 int, mul, add float32, dst, vrow []float32, level int) {
	dw := len(xt.first)
	_ = dst[(j1-j0)*dw*3-1]
	_ = vrow[4*(cx1-cx0)]
	var pix *C.uint8_t
	if len(src.Pix) > 0 {
		pix = (*C.uint8_t)(unsafe.Pointer(&src.Pix[0]))
	}
	C.im_resample_band(pix, C.ptrdiff_t(src.Stride), C.int(cx0), C.int(cx1),
		(*C.int32_t)(unsafe.Pointer(&xt.first[0])), (*C.int32_t)(unsafe.Pointer(&xt.count[0])), (*C.float)(unsafe.Pointer(&xt.w[0])), C.int(xt.n), C.int(dw),
		(*C.int32_t)(unsafe.Pointer(&yt.first[0])), (*C.int32_t)(unsafe.Pointer(&yt.count[0])), (*C.float)(unsafe.Pointer(&yt.w[0])), C.int(yt.n),
		C.int(j0), C.int(j1), C.float(mul), C.float(add), (*C.float)(unsafe.Pointer(&dst[0])), (*C.float)(unsafe.Pointer(&vrow[0])), C.int(level))
}

// rotatedBand computes output rows [j0, j1) of rotatedCropLevel into dst
// (the whole size x size x 3 output).
func rotatedBand(src *image.RGBA, cx, cy, cos, sin float64, offs []float64, k, size, j0, j1 int, dst []float32, mul, add float32, level int) {
	var pix *C.uint8_t
	if len(src.Pix) > 0 {
		pix = (*C.uint8_t)(unsafe.Pointer(&src.Pix[0]))
	}
	C.im_rotated_rows(pix, C.ptrdiff_t(src.Stride), C.int64_t(src.Rect.Dx()), C.int64_t(src.Rect.Dy()), C.double(cx), C.double(cy),
		C.double(cos), C.double(sin), (*C.double)(unsafe.Pointer(&offs[0])), C.int(k), C.int(size), C.int(j0), C.int(j1),
		(*C.float)(unsafe.Pointer(&dst[0])), C.float(mul), C.float(add), C.int(level))
}

// scanAbove returns in idx the indices i in [i0, i1) whose v[i] is not
// below thr (as many as fit, len(idx) >= 4), in order, and where the scan
// stopped (i1 when it is done).
func scanAbove(v []float32, i0, i1 int, thr float32, idx []int32) (n, next int) {
	if i0 >= i1 {
		return 0, i1
	}
	_ = v[i1-1]
	var nx C.int
	c := C.im_scan_above((*C.float)(unsafe.Pointer(&v[0])), C.int(i0), C.int(i1), C.float(thr),
		(*C.int32_t)(unsafe.Pointer(&idx[0])), C.int(len(idx)), &nx)
	return int(c), int(nx)
}
